package controller_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
)

// TestJoinCAConditionNamesWhatIsMissing: a control-plane join whose cluster
// CA Secret lacks a key waits with conditions naming the Secret and the
// key, not with "the Secrets are missing" (which sends the user looking
// for a Secret that exists); a Secret that does not exist is named as
// such; nothing is rendered.
func TestJoinCAConditionNamesWhatIsMissing(t *testing.T) {
	tests := []struct {
		name  string
		spoil func(s *corev1.Secret) (del bool)
		want  []string
	}{
		{"ca-without-key", func(s *corev1.Secret) bool { delete(s.Data, "tls.key"); return false },
			[]string{"Secret c1-ca has no tls.key (the private key)"}},
		{"ca-without-certificate", func(s *corev1.Secret) bool { delete(s.Data, "tls.crt"); return false },
			[]string{"Secret c1-ca has no tls.crt (the certificate)"}},
		{"ca-deleted", func(*corev1.Secret) bool { return true },
			[]string{"Secret c1-ca does not exist"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ns := e.Namespace(t)
			ctx := t.Context()
			cluster := e.Cluster(t, ns, "c1", true)
			e.SeedCA(t, cluster)
			ca := &corev1.Secret{}
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-ca"}, ca); err != nil {
				t.Fatal(err)
			}
			if tc.spoil(ca) {
				if err := e.Client.Delete(ctx, ca); err != nil {
					t.Fatal(err)
				}
			} else if err := e.Client.Update(ctx, ca); err != nil {
				t.Fatal(err)
			}
			_, cfg, err := e.Machine(ctx, cluster, "cp-1", true, bootstrapv1.KubeadmConfigSpec{})
			if err != nil {
				t.Fatal(err)
			}
			r := e.reconciler(controller.Config{})
			if err := e.reconcileOnce(t, r, cfg); err != nil {
				t.Fatal(err)
			}
			for _, typ := range []string{controller.ConditionCertificatesAvailable, controller.ConditionDataSecretAvailable} {
				c := condition(cfg, typ)
				if c == nil || c.Status != metav1.ConditionFalse || c.Reason != controller.ReasonWaitingForClusterCA {
					t.Fatalf("%s = %+v, want False with reason %s", typ, c, controller.ReasonWaitingForClusterCA)
				}
				for _, w := range tc.want {
					if !strings.Contains(c.Message, w) {
						t.Errorf("%s message %q does not say %q", typ, c.Message, w)
					}
				}
				if strings.Contains(c.Message, "c1-etcd") || strings.Contains(c.Message, "c1-sa") {
					t.Errorf("%s message %q names complete Secrets", typ, c.Message)
				}
			}
			if cfg.Status.DataSecretName != nil {
				t.Fatalf("data rendered without the CA key: %s", *cfg.Status.DataSecretName)
			}
		})
	}
}
