package controller_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
)

// data reads a config's data Secret's value.
func (e *env) data(t *testing.T, c *bootstrapv1.KubeadmConfig) []byte {
	t.Helper()
	if c.Status.DataSecretName == nil {
		t.Fatalf("%s has no data; conditions %+v", c.Name, c.Status.Conditions)
	}
	s := &corev1.Secret{}
	if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: c.Namespace, Name: *c.Status.DataSecretName}, s); err != nil {
		t.Fatal(err)
	}
	return s.Data["value"]
}

// userPasswords returns each user's password hash in data.
func userPasswords(t *testing.T, format bootstrapv1.Format, data []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	if format == bootstrapv1.FormatIgnition {
		for _, u := range rendertest.Ignition(t, data).Passwd.Users {
			if u.PasswordHash != nil {
				out[u.Name] = *u.PasswordHash
			}
		}
		return out
	}
	var cfg struct {
		Users []struct{ Name, Passwd string } `json:"users"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.Users {
		out[u.Name] = u.Passwd
	}
	return out
}

// TestPasswdFrom: a user's passwdFrom Secret is read into the data's
// password hash in both formats, as CABPK does; attested mode, whose data
// carries no secrets, refuses it with a condition.
func TestPasswdFrom(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	if err := e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ops-password"},
		Data: map[string][]byte{"hash": []byte("$6$salt$fromsecret")}}); err != nil {
		t.Fatal(err)
	}
	users := []cabpkv1.User{{Name: "ops", PasswdFrom: cabpkv1.PasswdSource{Secret: cabpkv1.SecretPasswdSource{Name: "ops-password", Key: "hash"}}}}
	r := e.reconciler(controller.Config{})
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		_, cfg, err := e.Machine(ctx, cluster, "worker-"+string(format), false, bootstrapv1.KubeadmConfigSpec{Format: format, Users: users})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.reconcileOnce(t, r, cfg); err != nil {
			t.Fatal(err)
		}
		if got := userPasswords(t, format, e.data(t, cfg))["ops"]; got != "$6$salt$fromsecret" {
			t.Errorf("%s: ops's password hash %q, want the Secret's", format, got)
		}
	}

	_, cfg, err := e.Machine(ctx, cluster, "attested", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig, Users: users,
		Attested: &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	if c := condition(cfg, controller.ConditionDataSecretAvailable); c == nil || c.Reason != controller.ReasonInvalidSpec ||
		!strings.Contains(c.Message, "passwdFrom") || cfg.Status.DataSecretName != nil {
		t.Fatalf("attested passwdFrom: condition %+v, data %v", c, cfg.Status.DataSecretName)
	}
}
