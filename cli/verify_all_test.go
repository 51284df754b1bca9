package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
)

// TestVerifyAll: `verify --all` prints every Node's continuous attestation
// state from a real API server, read from the records only Gatehouse
// writes: a Node that wrote itself Attested=True/Verified (as a node's
// kubelet credentials may) is shown as its record says, with what it
// claims flagged (it was shown Verified until the next round); a Node not
// verified yet is Unknown; and --all with --node is refused.
func TestVerifyAll(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: charts.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	records := nodeattestation.NewStore(client, charts.Namespace)
	now := time.Now()
	for _, r := range []nodeattestation.Record{
		{Node: "worker-1", Attested: true, Reason: continuous.ReasonVerified, Message: "fresh evidence verifies", Since: now, CheckedAt: now},
		{Node: "worker-2", Reason: continuous.ReasonEvidenceRejected, Message: "PCR 4 differs", Since: now, CheckedAt: now, Tainted: true, AwaitingRestore: true},
	} {
		if _, err := records.Update(ctx, r.Node, nil, func(nodeattestation.Record, bool) (nodeattestation.Record, bool) { return r, true }); err != nil {
			t.Fatal(err)
		}
	}
	forged := &corev1.NodeCondition{Type: continuous.ConditionType, Status: corev1.ConditionTrue, Reason: continuous.ReasonVerified, Message: "all good, says the node"}
	for name, c := range map[string]*corev1.NodeCondition{"worker-1": nil, "worker-2": forged, "worker-3": nil} {
		n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c == nil {
			continue
		}
		c.LastTransitionTime, c.LastHeartbeatTime = metav1.Now(), metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{*c}
		if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	out := run(t, "verify", "--all", "--kubeconfig", env.KubeconfigPath)
	for _, want := range []string{"NODE", "worker-1  True", "Verified", "worker-2  False", "EvidenceRejected", "yes, awaiting restore", "PCR 4 differs",
		"the Node's own condition says True/Verified", "worker-3  Unknown", "not verified yet"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify --all lacks %q:\n%s", want, out)
		}
	}
	var rows []nodeAttestation
	if err := json.Unmarshal([]byte(run(t, "verify", "--all", "--kubeconfig", env.KubeconfigPath, "-o", "json")), &rows); err != nil || len(rows) != 3 {
		t.Fatalf("verify --all -o json: %v, %d rows", err, len(rows))
	}
	for _, r := range rows {
		if r.Node == "worker-2" && (r.Attested != "False" || r.NodeSays != "True/Verified") {
			t.Errorf("worker-2: %+v, want False from the record and the forged True/Verified flagged", r)
		}
	}
	if out, err := runErr(t, "verify", "--all", "--node", "192.0.2.1:9001"); err == nil || !strings.Contains(err.Error(), "exclude each other") {
		t.Errorf("--all with --node: %v\n%s", err, out)
	}
}
