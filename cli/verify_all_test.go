package cli

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
)

// TestVerifyAll: `verify --all` prints every Node's continuous attestation
// state from a real API server: the recorded condition, or Unknown for a
// Node not verified yet; and refuses --all with --node.
func TestVerifyAll(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	conditions := map[string]*corev1.NodeCondition{
		"worker-1": {Type: continuous.ConditionType, Status: corev1.ConditionTrue, Reason: continuous.ReasonVerified, Message: "fresh evidence verifies"},
		"worker-2": {Type: continuous.ConditionType, Status: corev1.ConditionFalse, Reason: continuous.ReasonEvidenceRejected, Message: "PCR 4 differs"},
		"worker-3": nil,
	}
	for name, c := range conditions {
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
	for _, want := range []string{"NODE", "worker-1  True", "Verified", "worker-2  False", "EvidenceRejected", "PCR 4 differs", "worker-3  Unknown", "not verified yet"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify --all lacks %q:\n%s", want, out)
		}
	}
	var rows []nodeAttestation
	if err := json.Unmarshal([]byte(run(t, "verify", "--all", "--kubeconfig", env.KubeconfigPath, "-o", "json")), &rows); err != nil || len(rows) != 3 {
		t.Fatalf("verify --all -o json: %v, %d rows", err, len(rows))
	}
	if out, err := runErr(t, "verify", "--all", "--node", "192.0.2.1:9001"); err == nil || !strings.Contains(err.Error(), "exclude each other") {
		t.Errorf("--all with --node: %v\n%s", err, out)
	}
}
