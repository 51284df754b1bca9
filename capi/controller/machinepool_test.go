package controller_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
)

const (
	annotationManagedToken  = "bootstrap.gatehouse.dev/managed-bootstrap-token"
	annotationTokenRotation = "bootstrap.gatehouse.dev/bootstrap-token-rotation"
	labelTokenOwner         = "bootstrap.gatehouse.dev/kubeadm-config"
)

// TestMachinePoolData: a MachinePool's config waits for the control plane
// as a worker's does, then gets one data Secret with a worker's join (also
// for a pool labelled as a control plane: pools are never control planes,
// as in CABPK) and a bootstrap token owned and cleaned up as a Machine's.
// The MachinePool's deletion reaches the config through the MachinePool
// watch (the test API server runs no garbage collector): its token goes
// with it.
func TestMachinePoolData(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	e.startManager(t, controller.Config{})
	cluster := e.Cluster(t, ns, "c1", false)
	e.SeedCA(t, cluster)
	tests := []struct {
		name         string
		format       bootstrapv1.Format
		controlPlane bool
	}{
		{"pool-cloud-config", bootstrapv1.FormatCloudConfig, false},
		{"pool-ignition", bootstrapv1.FormatIgnition, false},
		{"pool-labelled-control-plane", bootstrapv1.FormatCloudConfig, true},
	}
	pools := map[string]*clusterv1.MachinePool{}
	for _, tc := range tests {
		mp, _, err := e.MachinePool(ctx, cluster, tc.name, 3, bootstrapv1.KubeadmConfigSpec{Format: tc.format})
		if err != nil {
			t.Fatal(err)
		}
		if tc.controlPlane {
			mp.Labels[clusterv1.MachineControlPlaneLabel] = ""
			if err := e.Client.Update(ctx, mp); err != nil {
				t.Fatal(err)
			}
		}
		pools[tc.name] = mp
	}
	e.WaitFor(t, ns, "the pools waiting for the control plane", func(cs []bootstrapv1.KubeadmConfig) bool {
		return len(cs) == len(tests) && !slices.ContainsFunc(cs, func(c bootstrapv1.KubeadmConfig) bool {
			return readyReason(&c) != controller.ReasonWaitingForControlPlane
		})
	})
	cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	if err := e.Client.Status().Update(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	configs := e.WaitFor(t, ns, "the pools' data", func(cs []bootstrapv1.KubeadmConfig) bool {
		return len(cs) == len(tests) && !slices.ContainsFunc(cs, func(c bootstrapv1.KubeadmConfig) bool { return c.Status.DataSecretName == nil })
	})
	for i := range configs {
		cfg := &configs[i]
		t.Run(cfg.Name, func(t *testing.T) {
			if *cfg.Status.DataSecretName != cfg.Name || !ptr.Deref(cfg.Status.Initialization.DataSecretCreated, false) {
				t.Fatalf("data Secret %q, created %v", *cfg.Status.DataSecretName, cfg.Status.Initialization)
			}
			files, _ := e.dataFiles(t, cfg) // checks the Secret's type, format and controller
			join := kubeadmConfig(files)
			kubeadmValidate(t, join)
			if !strings.Contains(string(join), "kind: JoinConfiguration") || strings.Contains(string(join), "controlPlane:") {
				t.Errorf("a pool's data is not a worker's join:\n%s", join)
			}
			if _, ok := files["/etc/kubernetes/pki/ca.key"]; ok {
				t.Error("a pool's data carries the cluster CA key")
			}
			tok, err := e.tokenSecret(t, cfg)
			if err != nil {
				t.Fatalf("the data's bootstrap token: %v", err)
			}
			if tok.Labels[labelTokenOwner] == "" || string(tok.Data["description"]) != "bootstrap token of KubeadmConfig "+ns+"/"+cfg.Name {
				t.Errorf("token Secret labels %v, description %q", tok.Labels, tok.Data["description"])
			}
			if tokens := e.configTokens(t, cfg); len(tokens) != 1 {
				t.Errorf("the config has tokens %v, want one", tokens)
			}
			if cfg.Annotations[annotationManagedToken] != "true" || !slices.Contains(cfg.Finalizers, controller.Finalizer) {
				t.Errorf("annotations %v, finalizers %v", cfg.Annotations, cfg.Finalizers)
			}

			// The pool goes away: the config and its token follow.
			if err := e.Client.Delete(ctx, pools[cfg.Name]); err != nil {
				t.Fatal(err)
			}
			e.WaitFor(t, ns, cfg.Name+" deleted", func(cs []bootstrapv1.KubeadmConfig) bool {
				return !slices.ContainsFunc(cs, func(c bootstrapv1.KubeadmConfig) bool { return c.Name == cfg.Name })
			})
			if err := e.Client.Get(ctx, client.ObjectKeyFromObject(tok), &corev1.Secret{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the bootstrap token outlived its MachinePool: %v", err)
			}
		})
	}
}

// poolFixture is a MachinePool-owned config reconciled by a test, with a
// fake clock.
type poolFixture struct {
	e     *env
	r     *controller.Reconciler
	clock *clocktesting.FakePassiveClock
	start time.Time
	ttl   time.Duration
	pool  *clusterv1.MachinePool
	cfg   *bootstrapv1.KubeadmConfig
}

func newPoolFixture(t *testing.T, replicas int32, spec bootstrapv1.KubeadmConfigSpec) *poolFixture {
	t.Helper()
	e := newEnv(t)
	cluster := e.Cluster(t, e.Namespace(t), "c1", true)
	e.SeedCA(t, cluster)
	f := &poolFixture{e: e, start: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), ttl: 15 * time.Minute}
	f.clock = clocktesting.NewFakePassiveClock(f.start)
	f.r = e.reconciler(controller.Config{Clock: f.clock, TokenTTL: f.ttl})
	var err error
	if f.pool, f.cfg, err = e.MachinePool(t.Context(), cluster, "pool", replicas, spec); err != nil {
		t.Fatal(err)
	}
	return f
}

// reconcile advances the clock to at (since start), reconciles and reads
// the config back.
func (f *poolFixture) reconcile(t *testing.T, at time.Duration) ctrl.Result {
	t.Helper()
	f.clock.SetTime(f.start.Add(at))
	res, err := f.r.Reconcile(t.Context(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(f.cfg)})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.e.Client.Get(t.Context(), client.ObjectKeyFromObject(f.cfg), f.cfg); err != nil {
		t.Fatal(err)
	}
	return res
}

// joined records n of the pool's instances as nodes.
func (f *poolFixture) joined(t *testing.T, n int) {
	t.Helper()
	f.pool.Status.NodeRefs = nil
	for i := range n {
		f.pool.Status.NodeRefs = append(f.pool.Status.NodeRefs, corev1.ObjectReference{Kind: "Node", Name: "pool-" + string(rune('a'+i))})
	}
	if err := f.e.Client.Status().Update(t.Context(), f.pool); err != nil {
		t.Fatal(err)
	}
}

// token is the token Secret the data carries, and its expiration.
func (f *poolFixture) token(t *testing.T) (*corev1.Secret, time.Time) {
	t.Helper()
	if f.cfg.Status.DataSecretName == nil {
		t.Fatalf("no data: conditions %+v", f.cfg.Status.Conditions)
	}
	s, err := f.e.tokenSecret(t, f.cfg)
	if err != nil {
		t.Fatalf("the data's bootstrap token: %v", err)
	}
	return s, expirationOf(t, s)
}

func expirationOf(t *testing.T, s *corev1.Secret) time.Time {
	t.Helper()
	exp, err := time.Parse(time.RFC3339, string(s.Data["expiration"]))
	if err != nil {
		t.Fatal(err)
	}
	return exp
}

// dataSecret reads the config's data Secret.
func (f *poolFixture) dataSecret(t *testing.T) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := f.e.Client.Get(t.Context(), client.ObjectKey{Namespace: f.cfg.Namespace, Name: f.cfg.Name}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMachinePoolTokenRefresh: a pool's token is extended over time while
// the pool scales, also after some of its nodes joined (it is never
// deleted for a join); once every replica has joined, it is rotated when
// less than half its TTL is left: the pool's one data Secret, under the
// same name, gets a new token, and the replaced one, no longer extended,
// is deleted once it has expired.
func TestMachinePoolTokenRefresh(t *testing.T) {
	f := newPoolFixture(t, 2, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition})
	ttl, start := f.ttl, f.start
	f.reconcile(t, 0)
	first, exp := f.token(t)
	if !exp.Equal(start.Add(ttl)) {
		t.Fatalf("new token expires %v, want %v", exp, start.Add(ttl))
	}
	dataVersion := f.dataSecret(t).ResourceVersion

	for _, step := range []struct {
		at     time.Duration
		joined int
		want   time.Time
	}{
		{5 * time.Minute, 0, start.Add(ttl)},                   // 10 min left: untouched
		{9 * time.Minute, 0, start.Add(9*time.Minute + ttl)},   // 6 min left: extended
		{17 * time.Minute, 1, start.Add(17*time.Minute + ttl)}, // a node joined, 7 min left: extended
		{20 * time.Minute, 2, start.Add(17*time.Minute + ttl)}, // all joined, 12 min left: untouched
	} {
		f.joined(t, step.joined)
		f.reconcile(t, step.at)
		tok, exp := f.token(t)
		if tok.Name != first.Name || !exp.Equal(step.want) {
			t.Fatalf("at %v with %d of 2 joined: token %s expires %v, want %s expiring %v", step.at, step.joined, tok.Name, exp, first.Name, step.want)
		}
		if v := f.dataSecret(t).ResourceVersion; v != dataVersion {
			t.Fatalf("at %v the data Secret changed without a rotation", step.at)
		}
	}

	// Every replica has joined and 7 min are left: rotated.
	res := f.reconcile(t, 25*time.Minute)
	second, exp := f.token(t)
	if second.Name == first.Name || !exp.Equal(start.Add(25*time.Minute+ttl)) {
		t.Fatalf("after the rotation the data carries %s expiring %v, want a new token expiring %v", second.Name, exp, start.Add(25*time.Minute+ttl))
	}
	if *f.cfg.Status.DataSecretName != f.cfg.Name || readyReason(f.cfg) != controller.ReasonDataSecretAvailable {
		t.Fatalf("after the rotation: data Secret %q, Ready reason %q", *f.cfg.Status.DataSecretName, readyReason(f.cfg))
	}
	if f.cfg.Annotations[annotationTokenRotation] != "1" {
		t.Errorf("annotations %v", f.cfg.Annotations)
	}
	old := &corev1.Secret{}
	if err := f.e.Client.Get(t.Context(), client.ObjectKeyFromObject(first), old); err != nil {
		t.Fatalf("the replaced token, still valid, was deleted at once: %v", err)
	}
	if got := expirationOf(t, old); !got.Equal(start.Add(17*time.Minute + ttl)) {
		t.Fatalf("the replaced token expires %v, want %v (not extended)", got, start.Add(17*time.Minute+ttl))
	}
	if res.RequeueAfter != 7*time.Minute {
		t.Fatalf("requeue after %v, want 7m (when the replaced token expires)", res.RequeueAfter)
	}

	// The replaced token has expired: deleted; the new one is untouched.
	f.reconcile(t, 32*time.Minute)
	if err := f.e.Client.Get(t.Context(), client.ObjectKeyFromObject(first), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the replaced token after its expiry: %v", err)
	}
	if tok, _ := f.token(t); tok.Name != second.Name || !slices.Equal(f.e.configTokens(t, f.cfg), []string{second.Name}) {
		t.Fatalf("the config's tokens %v, want only %s", f.e.configTokens(t, f.cfg), second.Name)
	}
}

// TestMachinePoolTokenReplaced: a pool's token that was deleted in the
// workload cluster, or expired once every replica has joined, is replaced
// at the next look (one that expired while the pool scales is extended:
// TestTokenOutlivesLongWaits): the data Secret,
// under the same name, is rewritten with a new token and the old one is
// gone. A pool whose spec no longer renders gets its condition and no new
// token.
func TestMachinePoolTokenReplaced(t *testing.T) {
	tests := []struct {
		name        string
		format      bootstrapv1.Format
		expire      bool // else delete
		breakSpec   bool
		wantReplace bool
	}{
		{"deleted-cloud-config", bootstrapv1.FormatCloudConfig, false, false, true},
		{"deleted-ignition", bootstrapv1.FormatIgnition, false, false, true},
		{"expired", bootstrapv1.FormatCloudConfig, true, false, true},
		{"spec-no-longer-renders", bootstrapv1.FormatCloudConfig, false, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newPoolFixture(t, 1, bootstrapv1.KubeadmConfigSpec{Format: tc.format})
			ctx := t.Context()
			f.reconcile(t, 0)
			old, _ := f.token(t)
			before := f.dataSecret(t)
			if tc.expire {
				f.joined(t, 1)
				patch := client.MergeFrom(old.DeepCopy())
				old.Data["expiration"] = []byte(f.start.Add(-time.Minute).Format(time.RFC3339))
				if err := f.e.Client.Patch(ctx, old, patch); err != nil {
					t.Fatal(err)
				}
			} else if err := f.e.Client.Delete(ctx, old); err != nil {
				t.Fatal(err)
			}
			if tc.breakSpec {
				f.cfg.Spec.PostKubeadmCommands = []string{"echo ${#PATH}"}
				if err := f.e.Client.Update(ctx, f.cfg); err != nil {
					t.Fatal(err)
				}
			}
			f.reconcile(t, f.ttl/2) // the next look at the token

			if err := f.e.Client.Get(ctx, client.ObjectKeyFromObject(old), &corev1.Secret{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the old token: %v", err)
			}
			after := f.dataSecret(t)
			if !tc.wantReplace {
				if c := condition(f.cfg, controller.ConditionDataSecretAvailable); c == nil || c.Reason != controller.ReasonRenderFailed {
					t.Fatalf("condition %+v, want %s", c, controller.ReasonRenderFailed)
				}
				if tokens := f.e.configTokens(t, f.cfg); len(tokens) > 0 {
					t.Fatalf("tokens %v were made for data that does not render", tokens)
				}
				if after.ResourceVersion != before.ResourceVersion {
					t.Fatal("the data Secret was rewritten without data")
				}
				return
			}
			tok, exp := f.token(t) // the data's token exists, with its secret
			if tok.Name == old.Name || !exp.Equal(f.start.Add(f.ttl/2+f.ttl)) {
				t.Fatalf("the data carries %s expiring %v; want a new token, not %s, expiring %v", tok.Name, exp, old.Name, f.start.Add(f.ttl/2+f.ttl))
			}
			if after.UID != before.UID || *f.cfg.Status.DataSecretName != before.Name || readyReason(f.cfg) != controller.ReasonDataSecretAvailable {
				t.Fatalf("data Secret %s (%s, was %s), Ready reason %q", *f.cfg.Status.DataSecretName, after.UID, before.UID, readyReason(f.cfg))
			}
			if tokens := f.e.configTokens(t, f.cfg); !slices.Equal(tokens, []string{tok.Name}) {
				t.Fatalf("the config's tokens %v, want only %s", tokens, tok.Name)
			}
		})
	}
}

// TestMachinePoolConfigDeleted: deleting a pool's config deletes its
// tokens, the current one and one a rotation replaced that is still valid.
func TestMachinePoolConfigDeleted(t *testing.T) {
	f := newPoolFixture(t, 1, bootstrapv1.KubeadmConfigSpec{})
	f.reconcile(t, 0)
	f.joined(t, 1)
	f.reconcile(t, 8*time.Minute) // 7 min left, every replica joined: rotated
	tokens := f.e.configTokens(t, f.cfg)
	if len(tokens) != 2 {
		t.Fatalf("tokens %v, want the replaced one and the new one", tokens)
	}
	if err := f.e.Client.Delete(t.Context(), f.cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := f.r.Reconcile(t.Context(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(f.cfg)}); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Client.Get(t.Context(), client.ObjectKeyFromObject(f.cfg), f.cfg); !apierrors.IsNotFound(err) {
		t.Fatalf("the config after its deletion: %v, finalizers %v", err, f.cfg.Finalizers)
	}
	for _, name := range tokens {
		if err := f.e.Client.Get(t.Context(), client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: name}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Errorf("token %s outlived its config: %v", name, err)
		}
	}
}

// TestMachinePoolAttested: an attested pool's data joins through the join
// service with no token: none is made, none is refreshed, and the data
// stays as it is while the pool lives and its nodes join.
func TestMachinePoolAttested(t *testing.T) {
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		t.Run(string(format), func(t *testing.T) {
			f := newPoolFixture(t, 2, bootstrapv1.KubeadmConfigSpec{Format: format,
				Attested: &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}}})
			f.reconcile(t, 0)
			if f.cfg.Status.DataSecretName == nil {
				t.Fatalf("no data: conditions %+v", f.cfg.Status.Conditions)
			}
			_, text := f.e.dataFiles(t, f.cfg)
			if !strings.Contains(text, "--join-endpoints 10.0.0.1:9090") || !strings.Contains(text, "--cluster-ca-hash sha256:") ||
				strings.Contains(text, "--control-plane") || strings.Contains(text, "kind: JoinConfiguration") {
				t.Fatalf("attested pool data:\n%s", text)
			}
			version := f.dataSecret(t).ResourceVersion
			f.joined(t, 2)
			for _, at := range []time.Duration{f.ttl / 2, f.ttl, 3 * f.ttl} {
				f.reconcile(t, at)
			}
			if v := f.dataSecret(t).ResourceVersion; v != version {
				t.Error("the attested pool's data was rewritten")
			}
			if tokens := f.e.configTokens(t, f.cfg); len(tokens) > 0 {
				t.Errorf("attested pool has bootstrap tokens %v", tokens)
			}
			if _, ok := f.cfg.Annotations[annotationManagedToken]; ok || slices.Contains(f.cfg.Finalizers, controller.Finalizer) {
				t.Errorf("annotations %v, finalizers %v", f.cfg.Annotations, f.cfg.Finalizers)
			}
		})
	}
}
