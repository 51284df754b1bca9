package nodeattestation

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRecordRoundTrip: a record survives its ConfigMap form, and a
// ConfigMap that is not the named node's record is refused.
func TestRecordRoundTrip(t *testing.T) {
	now := time.Date(2026, 11, 28, 1, 2, 3, 4, time.UTC)
	rec := Record{Node: "worker-1", Reason: "EvidenceRejected", Message: "PCR 4 differs", Identity: "tpm-ak:sha256:ab", Address: "10.0.0.5",
		Since: now, CheckedAt: now.Add(time.Minute), UnreachableSince: now, Tainted: true, AwaitingRestore: true, RestoredBy: "alice", RestoredAt: now}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: recordName("worker-1"), Namespace: "gatehouse-system"}, Data: rec.data()}
	got, err := fromConfigMap(cm, "worker-1")
	if err != nil {
		t.Fatal(err)
	}
	if got != rec {
		t.Errorf("round trip: %+v, want %+v", got, rec)
	}
	for _, tt := range []struct {
		name string
		cm   *corev1.ConfigMap
		want string
	}{
		{"another node's", cm, "worker-2"},
		{"renamed", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-attestation-x"}, Data: rec.data()}, "worker-1"},
		{"no node", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: recordName("")}, Data: map[string]string{}}, ""},
		{"bad bool", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: recordName("worker-1")}, Data: map[string]string{keyNode: "worker-1", keyTainted: "maybe"}}, "worker-1"},
		{"bad time", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: recordName("worker-1")}, Data: map[string]string{keyNode: "worker-1", keySince: "yesterday"}}, "worker-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := fromConfigMap(tt.cm, tt.want); err == nil {
				t.Error("accepted")
			}
		})
	}
	if n := recordName(strings.Repeat("a", 253)); len(n) != len(namePrefix)+32 {
		t.Errorf("name of a long node name: %q", n)
	}
}
