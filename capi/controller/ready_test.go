package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
)

// TestSetReady: Ready is the summary of every other condition; a False
// CertificatesAvailable shows in Ready even when the data condition does
// not say anything is wrong (a reconcile that failed while generating the
// CAs).
func TestSetReady(t *testing.T) {
	type cond struct {
		typ    string
		status metav1.ConditionStatus
		reason string
	}
	tests := []struct {
		name       string
		conditions []cond
		wantStatus metav1.ConditionStatus
		wantReason string
	}{
		{"data available, no certificates condition", []cond{{ConditionDataSecretAvailable, metav1.ConditionTrue, ReasonDataSecretAvailable}},
			metav1.ConditionTrue, ReasonDataSecretAvailable},
		{"all true", []cond{{ConditionDataSecretAvailable, metav1.ConditionTrue, ReasonDataSecretAvailable}, {ConditionCertificatesAvailable, metav1.ConditionTrue, ReasonCertificatesAvailable}},
			metav1.ConditionTrue, ReasonDataSecretAvailable},
		{"certificates failed, data undecided", []cond{{ConditionCertificatesAvailable, metav1.ConditionFalse, ReasonCertificatesGenerationFailed}},
			metav1.ConditionFalse, ReasonCertificatesGenerationFailed},
		{"certificates false, data true", []cond{{ConditionDataSecretAvailable, metav1.ConditionTrue, ReasonDataSecretAvailable}, {ConditionCertificatesAvailable, metav1.ConditionFalse, ReasonWaitingForClusterCA}},
			metav1.ConditionFalse, ReasonWaitingForClusterCA},
		{"data waiting first", []cond{{ConditionDataSecretAvailable, metav1.ConditionFalse, ReasonWaitingForInitLock}, {ConditionCertificatesAvailable, metav1.ConditionFalse, ReasonWaitingForClusterCA}},
			metav1.ConditionFalse, ReasonWaitingForInitLock},
		{"nothing yet", nil, metav1.ConditionUnknown, "Reconciling"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			config := &bootstrapv1.KubeadmConfig{}
			for _, c := range tt.conditions {
				setCondition(config, c.typ, c.status, c.reason, "")
			}
			if err := setReady(config); err != nil {
				t.Fatal(err)
			}
			ready := meta.FindStatusCondition(config.Status.Conditions, ConditionReady)
			if ready == nil || ready.Status != tt.wantStatus || ready.Reason != tt.wantReason {
				t.Fatalf("Ready = %+v, want %s with reason %s", ready, tt.wantStatus, tt.wantReason)
			}
		})
	}
}
