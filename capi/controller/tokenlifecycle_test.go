package controller_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
)

// TestTokenOutlivesLongWaits: a token whose Secret still exists is
// extended however long nothing reconciled its config (CABPK's
// refreshBootstrapTokenIfNeeded): a Machine, and a MachinePool that scales,
// wait 3 hours between reconciles, twice, by a fake clock, and each time
// the data's token is valid again (same Secret, same secret, expiring
// TTL from now) and the data Secret is untouched. The test API server runs
// no token cleaner, so an expired Secret stays, as it does in a workload
// cluster whose kube-controller-manager is down or slow.
func TestTokenOutlivesLongWaits(t *testing.T) {
	const wait = 3 * time.Hour
	for _, pool := range []bool{false, true} {
		name := map[bool]string{false: "machine", true: "machine-pool"}[pool]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ns := e.Namespace(t)
			ctx := t.Context()
			cluster := e.Cluster(t, ns, "c1", true)
			e.SeedCA(t, cluster)
			start := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
			clock := clocktesting.NewFakePassiveClock(start)
			ttl := 15 * time.Minute
			r := e.reconciler(controller.Config{Clock: clock, TokenTTL: ttl})
			var cfg *bootstrapv1.KubeadmConfig
			var err error
			if pool {
				_, cfg, err = e.MachinePool(ctx, cluster, name, 2, bootstrapv1.KubeadmConfigSpec{})
			} else {
				_, cfg, err = e.Machine(ctx, cluster, name, false, bootstrapv1.KubeadmConfigSpec{})
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := e.reconcileOnce(t, r, cfg); err != nil {
				t.Fatal(err)
			}
			first, err := e.tokenSecret(t, cfg)
			if err != nil {
				t.Fatal(err)
			}
			data := dataSecretOf(t, e, cfg)
			for i := 1; i <= 2; i++ {
				clock.SetTime(start.Add(time.Duration(i) * wait))
				res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cfg)})
				if err != nil {
					t.Fatal(err)
				}
				if err := e.Client.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
					t.Fatal(err)
				}
				if readyReason(cfg) != controller.ReasonDataSecretAvailable {
					t.Fatalf("after %v without a reconcile: conditions %+v", time.Duration(i)*wait, cfg.Status.Conditions)
				}
				tok, err := e.tokenSecret(t, cfg) // also checks the data's secret is the Secret's
				if err != nil {
					t.Fatal(err)
				}
				if tok.Name != first.Name || string(tok.Data["token-secret"]) != string(first.Data["token-secret"]) {
					t.Fatalf("after %v the data carries token %s, want %s extended", time.Duration(i)*wait, tok.Name, first.Name)
				}
				if exp := expirationOf(t, tok); !exp.Equal(clock.Now().Add(ttl)) {
					t.Fatalf("after %v the token expires %v, want %v", time.Duration(i)*wait, exp, clock.Now().Add(ttl))
				}
				if res.RequeueAfter <= 0 || res.RequeueAfter > ttl {
					t.Fatalf("requeue after %v, want (0, %v]", res.RequeueAfter, ttl)
				}
				if v := dataSecretOf(t, e, cfg).ResourceVersion; v != data.ResourceVersion {
					t.Fatalf("after %v the data Secret was rewritten", time.Duration(i)*wait)
				}
			}
			if tokens := e.configTokens(t, cfg); !slices.Equal(tokens, []string{first.Name}) {
				t.Fatalf("the config's tokens %v, want only %s", tokens, first.Name)
			}
		})
	}
}

// TestDeletedMachineTokenReported: a Machine's token Secret deleted in the
// workload cluster before its node joined is reported with a condition
// naming the Secret; nothing is made again (CABPK reports a Machine's
// missing token; its data may already be on the machine, and whoever
// deleted it may have revoked it): no new token, the data Secret as it
// was. Should the Secret come back, it is extended again.
func TestDeletedMachineTokenReported(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	start := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakePassiveClock(start)
	ttl := 15 * time.Minute
	r := e.reconciler(controller.Config{Clock: clock, TokenTTL: ttl})
	_, cfg, err := e.Machine(ctx, cluster, "worker-0", false, bootstrapv1.KubeadmConfigSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	tok, err := e.tokenSecret(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	data := dataSecretOf(t, e, cfg)
	if err := e.Client.Delete(ctx, tok); err != nil {
		t.Fatal(err)
	}

	clock.SetTime(start.Add(ttl / 2)) // the next look at the token
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	c := condition(cfg, controller.ConditionDataSecretAvailable)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != controller.ReasonBootstrapTokenExpired ||
		!strings.Contains(c.Message, "kube-system/"+tok.Name) || readyReason(cfg) != controller.ReasonBootstrapTokenExpired {
		t.Fatalf("condition %+v, want %s naming Secret kube-system/%s", c, controller.ReasonBootstrapTokenExpired, tok.Name)
	}
	if strings.Contains(c.Message, string(tok.Data["token-secret"])) {
		t.Fatal("the condition carries the token's secret")
	}
	if tokens := e.configTokens(t, cfg); len(tokens) > 0 {
		t.Fatalf("a Machine's deleted token was made again: %v", tokens)
	}
	if v := dataSecretOf(t, e, cfg).ResourceVersion; v != data.ResourceVersion {
		t.Fatal("the data Secret was rewritten")
	}

	// Restored (from a backup, say): extended again, the condition cleared.
	tok.ResourceVersion, tok.UID = "", ""
	if err := e.Client.Create(ctx, tok); err != nil {
		t.Fatal(err)
	}
	clock.SetTime(start.Add(time.Hour))
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	got, err := e.tokenSecret(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if exp := expirationOf(t, got); !exp.Equal(clock.Now().Add(ttl)) || readyReason(cfg) != controller.ReasonDataSecretAvailable {
		t.Fatalf("restored token expires %v (want %v), conditions %+v", exp, clock.Now().Add(ttl), cfg.Status.Conditions)
	}
}

func dataSecretOf(t *testing.T, e *env, c *bootstrapv1.KubeadmConfig) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, s); err != nil {
		t.Fatal(err)
	}
	return s
}
