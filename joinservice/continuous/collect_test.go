package continuous

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// TestRecordsOfGoneNodesAreCollected: the record of a Node that is gone is
// deleted once it was last checked more than the retention ago; the record
// of a Node that exists, of a gone Node checked recently, and of a gone
// Node awaiting an administrator's restore (which a machine rejoining
// under its name must still pass) are kept.
func TestRecordsOfGoneNodesAreCollected(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "present"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old := now.Add(-minRecordRetention - time.Minute)
	store := nodeattestation.NewStore(client, namespace)
	for _, r := range []nodeattestation.Record{
		{Node: "present", Attested: true, Reason: ReasonVerified, CheckedAt: old},
		{Node: "gone", Attested: true, Reason: ReasonVerified, CheckedAt: old},
		{Node: "gone-tainted", Reason: ReasonEvidenceRejected, Tainted: true, CheckedAt: old},
		{Node: "gone-recently", Attested: true, Reason: ReasonVerified, CheckedAt: now.Add(-time.Minute)},
		{Node: "gone-awaiting-restore", Reason: ReasonEvidenceRejected, Tainted: true, AwaitingRestore: true, CheckedAt: old},
	} {
		if _, err := store.Update(ctx, r.Node, nil, func(nodeattestation.Record, bool) (nodeattestation.Record, bool) { return r, true }); err != nil {
			t.Fatal(err)
		}
	}
	c := startCaches(t, client)
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		list, err := c.records.List()
		return err == nil && len(list) == 5, nil
	})
	if err != nil {
		t.Fatal("the records did not reach the cache")
	}
	waitCached(t, client, c.nodes)
	reg := prometheus.NewRegistry()
	var logs testkit.LogBuffer
	loop, err := NewLoop(LoopConfig{Client: client, Nodes: c.nodes, Records: store, RecordCache: c.records,
		Checker: stubChecker{}, Events: NewEventRecorder(ctx, client), Interval: 15 * time.Second,
		Log: slog.New(slog.NewJSONHandler(&logs, nil)), Registerer: reg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := c.nodes.List()
	if err != nil {
		t.Fatal(err)
	}
	loop.collect(ctx, nodes)

	for node, kept := range map[string]bool{"present": true, "gone": false, "gone-tainted": false, "gone-recently": true, "gone-awaiting-restore": true} {
		_, err := store.Get(ctx, node)
		switch {
		case kept && err != nil:
			t.Errorf("the record of %s: %v, want it kept", node, err)
		case !kept && !errors.Is(err, nodeattestation.ErrNoRecord):
			t.Errorf("the record of %s: %v, want it deleted", node, err)
		}
		if audited := strings.Contains(logs.String(), `"event":"reattest.record_deleted","node":"`+node+`"`); audited == kept {
			t.Errorf("the record of %s: audited as deleted %v, want %v", node, audited, !kept)
		}
	}
	if got := testutil.ToFloat64(loop.metrics.recordsDeleted); got != 2 {
		t.Errorf("records_deleted_total = %v, want 2", got)
	}
}

// stubChecker is a checker for tests that run no round.
type stubChecker struct{}

func (stubChecker) Check(context.Context, *corev1.Node) (Outcome, error) {
	return Outcome{}, errors.New("no checks in this test")
}

func (stubChecker) Settings() (joinconfig.ContinuousAttestation, error) {
	return joinconfig.ContinuousAttestation{}, nil
}
