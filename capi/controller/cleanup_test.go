package controller_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
)

// configTokens lists the bootstrap token Secrets made for a config: their
// description names it (kube-system is shared by the package's tests).
func (e *env) configTokens(t *testing.T, c *bootstrapv1.KubeadmConfig) []string {
	t.Helper()
	var secrets corev1.SecretList
	if err := e.Client.List(t.Context(), &secrets, client.InNamespace(metav1.NamespaceSystem)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range secrets.Items {
		if strings.HasSuffix(string(s.Data["description"]), " "+c.Namespace+"/"+c.Name) {
			names = append(names, s.Name)
		}
	}
	return names
}

// TestNothingBeforeRender: a join whose data cannot be rendered or stored
// gets its condition and nothing else: no bootstrap token in the workload
// cluster, no finalizer, no token or URL annotation, also after another
// reconcile; for a Machine's config and a MachinePool's alike.
func TestNothingBeforeRender(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	r := e.reconciler(controller.Config{})
	ignition := bootstrapv1.FormatIgnition
	tests := []struct {
		name   string
		spec   bootstrapv1.KubeadmConfigSpec
		reason string
	}{
		{"butane-that-does-not-translate", bootstrapv1.KubeadmConfigSpec{Format: ignition,
			Ignition: &bootstrapv1.IgnitionSpec{AdditionalConfig: "variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n  - path: relative\n"}}, controller.ReasonRenderFailed},
		{"jinja-that-does-not-parse", bootstrapv1.KubeadmConfigSpec{PostKubeadmCommands: []string{"echo ${#PATH}"}}, controller.ReasonRenderFailed},
		{"mount-ignition-cannot-make", bootstrapv1.KubeadmConfigSpec{Format: ignition, Mounts: []cabpkv1.MountPoints{{"ephemeral0", "/mnt"}}}, controller.ReasonRenderFailed},
		{"container-linux-config", bootstrapv1.KubeadmConfigSpec{Format: ignition,
			Ignition: &bootstrapv1.IgnitionSpec{ContainerLinuxConfig: cabpkv1.ContainerLinuxConfig{AdditionalConfig: "storage: {}\n"}}}, controller.ReasonInvalidSpec},
		{"bucket-credentials-missing", bootstrapv1.KubeadmConfigSpec{UserDataStore: &bootstrapv1.UserDataStore{
			Endpoint: "s3.example.com", Bucket: "bootstrap", CredentialsSecret: "missing"}}, controller.ReasonUserDataStoreFailed},
	}
	owners := []struct {
		kind string
		make func(name string, spec bootstrapv1.KubeadmConfigSpec) (*bootstrapv1.KubeadmConfig, error)
	}{
		{"Machine", func(name string, spec bootstrapv1.KubeadmConfigSpec) (*bootstrapv1.KubeadmConfig, error) {
			_, cfg, err := e.Machine(ctx, cluster, name, false, spec)
			return cfg, err
		}},
		{"MachinePool", func(name string, spec bootstrapv1.KubeadmConfigSpec) (*bootstrapv1.KubeadmConfig, error) {
			_, cfg, err := e.MachinePool(ctx, cluster, name, 3, spec)
			return cfg, err
		}},
	}
	for _, o := range owners {
		for _, tc := range tests {
			t.Run(o.kind+"/"+tc.name, func(t *testing.T) {
				cfg, err := o.make(strings.ToLower(o.kind)+"-"+tc.name, tc.spec)
				if err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if err := e.reconcileOnce(t, r, cfg); err != nil {
						t.Fatal(err)
					}
				}
				if c := condition(cfg, controller.ConditionDataSecretAvailable); c == nil || c.Reason != tc.reason || cfg.Status.DataSecretName != nil {
					t.Fatalf("condition %+v, data %v; want reason %s and no data", c, cfg.Status.DataSecretName, tc.reason)
				}
				if slices.Contains(cfg.Finalizers, controller.Finalizer) {
					t.Errorf("finalizers %v", cfg.Finalizers)
				}
				for _, a := range []string{annotationManagedToken, annotationPresignedURLExpiry} {
					if _, ok := cfg.Annotations[a]; ok {
						t.Errorf("annotations %v", cfg.Annotations)
					}
				}
				if tokens := e.configTokens(t, cfg); len(tokens) > 0 {
					t.Errorf("bootstrap tokens %v were created for data that does not exist", tokens)
				}
			})
		}
	}
}

// TestTokenFoundAgain: a reconcile whose result was lost after it created
// the token (no data Secret, no status) renders the data again with that
// same token, and the config still has one token.
func TestTokenFoundAgain(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	r := e.reconciler(controller.Config{})
	_, cfg, err := e.Machine(ctx, cluster, "worker", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition})
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
	if err := e.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: *cfg.Status.DataSecretName}}); err != nil {
		t.Fatal(err)
	}
	cfg.Status.DataSecretName, cfg.Status.Initialization = nil, nil
	if err := e.Client.Status().Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	again, err := e.tokenSecret(t, cfg) // fails unless the data's token is this Secret's
	if err != nil {
		t.Fatal(err)
	}
	if again.Name != first.Name || again.UID != first.UID {
		t.Fatalf("the data carries token %s, not the config's existing %s", again.Name, first.Name)
	}
	if tokens := e.configTokens(t, cfg); len(tokens) != 1 {
		t.Fatalf("the config has tokens %v", tokens)
	}
}
