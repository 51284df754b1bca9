package cli

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestNodeAdopt: on a real API server, `node adopt` adopts a Node's name
// that no identity holds, with an audit line naming who; the name stays
// unbound until a machine claims it, then binds it with the adoption;
// adopting a bound name is refused (and audited) with how to rebind; bad
// flags are refused before anything is written.
func TestNodeAdopt(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: charts.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-7"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	store := nodebinding.New(client, charts.Namespace, time.Now)
	const admin = "gatehouse-testenv-admin" // the test environment's administrator certificate
	machine := "tpm-ak:sha256:" + strings.Repeat("ab", 32)

	out := run(t, "node", "adopt", "worker-7", "--kubeconfig", env.KubeconfigPath, "--identity", machine, "--ttl", "2h")
	for _, want := range []string{
		"Adopted node name worker-7", "The machine " + machine,
		"msg=audit event=node.adopt node=worker-7 by=" + admin + " identity=" + machine, "verdict=adopted", "nodeExists=true",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("node adopt output lacks %q:\n%s", want, out)
		}
	}
	if id, err := store.Identity(ctx, "worker-7"); !errors.Is(err, nodebinding.ErrNotBound) {
		t.Fatalf("the adopted name is bound to %q (%v) before any machine claimed it", id, err)
	}
	if _, err := store.Claim(ctx, "worker-7", "tpm-ak:sha256:"+strings.Repeat("cd", 32)); !errors.Is(err, nodebinding.ErrNameHeld) {
		t.Fatalf("another machine claiming the name adopted for %s: %v, want ErrNameHeld", machine, err)
	}

	// Adopting again before any machine bound it replaces the adoption.
	out = run(t, "node", "adopt", "worker-7", "--kubeconfig", env.KubeconfigPath)
	if !strings.Contains(out, "replaces the adoption by "+admin) || !strings.Contains(out, "replaced.by="+admin) {
		t.Errorf("adopting again does not say it replaces the earlier adoption:\n%s", out)
	}
	b, err := store.Claim(ctx, "worker-7", machine)
	if err != nil || b.Adoption == nil || b.Adoption.By != admin {
		t.Fatalf("the machine claiming the adopted name: %+v, %v; want a binding under %s's adoption", b, err, admin)
	}

	out, err = runErr(t, "node", "adopt", "worker-7", "--kubeconfig", env.KubeconfigPath)
	if !errors.Is(err, nodebinding.ErrNameBound) || !strings.Contains(err.Error(), nodebinding.AnnotationAllowIdentity) {
		t.Errorf("adopting a bound name: %v, want ErrNameBound saying how to rebind", err)
	}
	if !strings.Contains(out, "verdict=refused") {
		t.Errorf("the refused adoption is not audited:\n%s", out)
	}
	if id, err := store.Identity(ctx, "worker-7"); err != nil || id != machine {
		t.Errorf("after the refused adoption worker-7 is bound to %q (%v), want %s", id, err, machine)
	}

	// A reserved name: no Node yet.
	if out := run(t, "node", "adopt", "worker-8", "--kubeconfig", env.KubeconfigPath); !strings.Contains(out, "No Node worker-8 exists") {
		t.Errorf("adopting a name no Node holds does not say so:\n%s", out)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"an identity of another form", []string{"--identity", "sev-snp-chip:00"}, "is not an attestation identity"},
		{"an identity in upper case", []string{"--identity", "tpm-ak:sha256:" + strings.Repeat("AB", 32)}, "is not an attestation identity"},
		{"no time to bind", []string{"--ttl", "0s"}, "must be positive"},
		{"no name", nil, "accepts 1 arg"},
	} {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			args := []string{"node", "adopt", "worker-9", "--kubeconfig", env.KubeconfigPath}
			if tc.args == nil {
				args = []string{"node", "adopt", "--kubeconfig", env.KubeconfigPath}
			}
			_, err := runErr(t, append(args, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error saying %q", err, tc.want)
			}
		})
	}
	if _, err := client.CoreV1().ConfigMaps(charts.Namespace).Get(ctx, nodebinding.Name("worker-9"), metav1.GetOptions{}); err == nil {
		t.Error("a refused adoption wrote a binding ConfigMap")
	}
}
