package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestNodeRestore: an administrator restores a node awaiting it, on a real
// API server: the record's AwaitingRestore is cleared (its verdict and
// taint stay, for the loop to lift), who restored it is recorded and
// audited; a node never judged is refused with the reason.
func TestNodeRestore(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: charts.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	store := nodeattestation.NewStore(client, charts.Namespace)
	judged := nodeattestation.Record{Node: "worker-4", Reason: "EvidenceRejected", Message: "PCR 4 differs", CheckedAt: time.Now(), Tainted: true, AwaitingRestore: true}
	if _, err := store.Update(ctx, "worker-4", nil, func(nodeattestation.Record, bool) (nodeattestation.Record, bool) { return judged, true }); err != nil {
		t.Fatal(err)
	}
	var out, logs bytes.Buffer
	o := restoreOptions{kubeconfig: env.KubeconfigPath, namespace: charts.Namespace, by: "alice"}
	if err := runRestore(ctx, &out, &logs, "worker-4", o); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(ctx, "worker-4")
	if err != nil {
		t.Fatal(err)
	}
	if rec.AwaitingRestore || !rec.Tainted || rec.Reason != "EvidenceRejected" || rec.RestoredBy != "alice" || rec.RestoredAt.IsZero() {
		t.Errorf("record after restore: %+v", rec)
	}
	if !strings.Contains(logs.String(), `"event":"node.restore","node":"worker-4","by":"alice","wasAwaitingRestore":true`) {
		t.Errorf("no audit line: %s", logs.String())
	}
	if !strings.Contains(out.String(), "restored") {
		t.Errorf("output: %s", out.String())
	}
	if err := runRestore(ctx, &out, &logs, "worker-never", o); err == nil || !strings.Contains(err.Error(), "no attestation record") {
		t.Errorf("restoring a node never judged: %v", err)
	}
}
