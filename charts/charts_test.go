package charts

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// testValues make each chart renderable: the join config is required.
var testValues = map[string]map[string]any{
	"gatehouse-keyservice": {},
	"gatehouse-joinservice": {"joinConfig": map[string]any{
		"attestation":          "variant: tpm\npcrs: [4, 15]\nreferenceValues: {}\npinnedAKs: []\n",
		"measurementSalt":      strings.Repeat("ab", 32),
		"apiServerEndpoint":    "10.0.0.1:6443",
		"kubernetesVersion":    "v1.36.4",
		"kubernetesComponents": "[]",
	}, "denyList": []string{"node:bad"}},
}

// TestLint runs Helm's linter (the SDK behind `helm lint`) on each chart.
func TestLint(t *testing.T) {
	for _, name := range Names {
		t.Run(name, func(t *testing.T) {
			result := lint.AllWithKubeVersion(name, testValues[name], "kube-system", &chartutil.KubeVersion{Version: "v1.36.4", Major: "1", Minor: "36"})
			for _, m := range result.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
}

// render renders a chart as `helm install --dry-run` does, without a cluster.
func render(t *testing.T, name string, values map[string]any) (string, error) {
	t.Helper()
	return renderIn(t, name, values, Namespace)
}

// renderIn renders a chart for a release in namespace.
func renderIn(t *testing.T, name string, values map[string]any, namespace string) (string, error) {
	t.Helper()
	c, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(&action.Configuration{})
	install.ClientOnly, install.DryRun, install.ReleaseName, install.Namespace = true, true, name, namespace
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.36.4", Major: "1", Minor: "36"}
	rel, err := install.Run(c, values)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// TestRenderAndApply renders each chart and has the real API server accept
// every object (server-side dry run).
func TestRenderAndApply(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	if out, err := exec.CommandContext(t.Context(), filepath.Join(env.BinDir, "kubectl"), "--kubeconfig", env.KubeconfigPath,
		"create", "namespace", Namespace).CombinedOutput(); err != nil {
		t.Fatalf("creating namespace %s: %v\n%s", Namespace, err, out)
	}
	cases := []struct {
		name, chart string
		values      map[string]any
		want        []string
		// has are strings the manifest must carry.
		has []string
	}{
		{"gatehouse-joinservice", "gatehouse-joinservice", testValues["gatehouse-joinservice"],
			[]string{"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service"}, nil},
		// No RBAC by default: the master secret is a mounted volume.
		{"gatehouse-keyservice", "gatehouse-keyservice", testValues["gatehouse-keyservice"], []string{"ServiceAccount", "Deployment", "Service"}, nil},
		// One per control plane, on the node's network (gatehouse mini up).
		{"gatehouse-keyservice-daemonset", "gatehouse-keyservice", map[string]any{"kind": "DaemonSet", "hostNetwork": true, "listenHost": "127.0.0.1"},
			[]string{"ServiceAccount", "DaemonSet", "Service"}, nil},
		// An external KMS: Vault's token from a Secret, AWS settings in the
		// environment.
		{"gatehouse-keyservice-external-kms", "gatehouse-keyservice", map[string]any{
			"kms":               map[string]any{"checkInterval": "30s"},
			"extraEnv":          []any{map[string]any{"name": "AWS_REGION", "value": "eu-west-1"}},
			"extraVolumes":      []any{map[string]any{"name": "vault-token", "secret": map[string]any{"secretName": "gatehouse-vault-token"}}},
			"extraVolumeMounts": []any{map[string]any{"name": "vault-token", "mountPath": "/run/vault", "readOnly": true}},
		}, []string{"ServiceAccount", "Deployment", "Service"}, []string{"--kms-check-interval=30s", "name: AWS_REGION", "secretName: gatehouse-vault-token", "mountPath: /run/vault"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			manifest, err := render(t, tc.chart, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]int{}
			for _, doc := range strings.Split(manifest, "\n---") {
				var obj struct {
					Kind string `json:"kind"`
				}
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatalf("rendered YAML: %v", err)
				}
				if obj.Kind != "" {
					kinds[obj.Kind]++
				}
			}
			for _, k := range tc.want {
				if kinds[k] == 0 {
					t.Errorf("rendered %v: no %s", kinds, k)
				}
			}
			for _, s := range tc.has {
				if !strings.Contains(manifest, s) {
					t.Errorf("the manifest lacks %q:\n%s", s, manifest)
				}
			}
			cmd := exec.CommandContext(t.Context(), filepath.Join(env.BinDir, "kubectl"), "--kubeconfig", env.KubeconfigPath,
				"apply", "--dry-run=server", "-f", "-")
			cmd.Stdin = bytes.NewBufferString(manifest)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("the API server refuses the rendered chart: %v\n%s", err, out)
			}
		})
	}
}

func TestRequiredValues(t *testing.T) {
	_, err := render(t, "gatehouse-joinservice", nil)
	if err == nil || !strings.Contains(err.Error(), "joinConfig.attestation") {
		t.Fatalf("rendering without a join config: %v", err)
	}
	_, err = render(t, "gatehouse-keyservice", map[string]any{"kms": map[string]any{"existingSecret": ""}})
	if err == nil || !strings.Contains(err.Error(), "kms.existingSecret") {
		t.Fatalf("rendering without the KMS Secret: %v", err)
	}
	_, err = render(t, "gatehouse-keyservice", map[string]any{"kind": "StatefulSet"})
	if err == nil || !strings.Contains(err.Error(), `kind is "StatefulSet": it must be Deployment or DaemonSet`) {
		t.Fatalf("rendering the key service as a StatefulSet: %v", err)
	}
}
