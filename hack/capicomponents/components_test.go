package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/yaml"
)

// repoRoot is the repository root, seen from this package's directory.
var repoRoot = filepath.Join("..", "..")

func committed(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "config", "clusterctl", name))
	if err != nil {
		t.Fatalf("%v: run make generate", err)
	}
	return b
}

// variableRE matches a clusterctl variable with a default, ${NAME:=default}.
var variableRE = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*):=([^}]*)\}`)

// withDefaults replaces every ${NAME:=default} with its default, as
// clusterctl does when NAME is set neither in the environment nor in its
// config file. Any other ${ left over is an error: clusterctl would refuse
// to install without a value for it.
func withDefaults(raw []byte) ([]byte, error) {
	out := variableRE.ReplaceAll(raw, []byte("$2"))
	if i := bytes.Index(out, []byte("${")); i >= 0 {
		line, _, _ := bytes.Cut(out[i:], []byte("\n"))
		return nil, errors.New("a variable without a default: " + string(line))
	}
	return out, nil
}

// parseObjects splits a multi-document YAML stream into objects.
func parseObjects(t *testing.T, raw []byte) []*unstructured.Unstructured {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// defaultObjects are the committed components with every variable at its
// default.
func defaultObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	raw, err := withDefaults(committed(t, componentsFile))
	if err != nil {
		t.Fatal(err)
	}
	return parseObjects(t, raw)
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %q among the components", kind, name)
	return nil
}

// managerContainer returns the Deployment's manager container.
func managerContainer(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	containers, _, err := unstructured.NestedSlice(find(t, objs, "Deployment", appName).Object, "spec", "template", "spec", "containers")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range containers {
		if c, ok := c.(map[string]any); ok && c["name"] == containerName {
			return c
		}
	}
	t.Fatalf("the Deployment has no container named %q (the contract's name)", containerName)
	return nil
}

func managerArgs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	args, _, err := unstructured.NestedStringSlice(managerContainer(t, objs), "args")
	if err != nil {
		t.Fatal(err)
	}
	return args
}

// TestGeneratedIsCurrent: the committed repository files are what the
// generator makes from the committed CRDs and ClusterRole.
func TestGeneratedIsCurrent(t *testing.T) {
	out := t.TempDir()
	if err := run(filepath.Join(repoRoot, "config", "crd"), filepath.Join(repoRoot, "config", "rbac", "role.yaml"), out, defaultVersion); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{metadataFile, componentsFile} {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, committed(t, name)) {
			t.Errorf("config/clusterctl/%s is out of date: run make generate", name)
		}
	}
}

// TestComponents checks the clusterctl provider contract's rules that need
// no API server.
func TestComponents(t *testing.T) {
	raw := committed(t, componentsFile)
	objs := defaultObjects(t)
	for _, tc := range []struct {
		name  string
		check func(t *testing.T)
	}{
		{"the CRDs map contract v1beta2 to v1alpha1", func(t *testing.T) {
			n := 0
			for _, o := range objs {
				if o.GetKind() != "CustomResourceDefinition" {
					continue
				}
				n++
				if got := o.GetLabels()["cluster.x-k8s.io/v1beta2"]; got != "v1alpha1" {
					t.Errorf("CRD %s: label cluster.x-k8s.io/v1beta2 = %q, want v1alpha1", o.GetName(), got)
				}
			}
			if n != 2 {
				t.Errorf("%d CRDs, want KubeadmConfig and KubeadmConfigTemplate", n)
			}
		}},
		{"the CRDs are named plural.group, as clusterctl init's preflight requires", func(t *testing.T) {
			for _, name := range []string{"kubeadmconfigs", "kubeadmconfigtemplates"} {
				crd := find(t, objs, "CustomResourceDefinition", name+".bootstrap.gatehouse.dev")
				kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
				if strings.ToLower(kind)+"s" != name {
					t.Errorf("CRD %s is for kind %s", crd.GetName(), kind)
				}
			}
		}},
		{"every object carries the provider label", func(t *testing.T) {
			for _, o := range objs {
				if got := o.GetLabels()[clusterv1.ProviderNameLabel]; got != providerLabel {
					t.Errorf("%s %s: label %s = %q, want %q", o.GetKind(), o.GetName(), clusterv1.ProviderNameLabel, got, providerLabel)
				}
			}
		}},
		{"exactly one Namespace, holding every namespaced object", func(t *testing.T) {
			var namespaces []string
			for _, o := range objs {
				switch o.GetKind() {
				case "Namespace":
					namespaces = append(namespaces, o.GetName())
				case "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding":
					if o.GetNamespace() != "" {
						t.Errorf("cluster-scoped %s %s has namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
					}
				default:
					if o.GetNamespace() != namespace {
						t.Errorf("%s %s is in namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), namespace)
					}
				}
			}
			if !slices.Equal(namespaces, []string{namespace}) {
				t.Errorf("Namespaces %q, want [%s]", namespaces, namespace)
			}
		}},
		{"the variables are the documented ones, each with a default", func(t *testing.T) {
			var got []string
			for _, m := range variableRE.FindAllSubmatch(raw, -1) {
				if !slices.Contains(got, string(m[1])) {
					got = append(got, string(m[1]))
				}
			}
			slices.Sort(got)
			want := []string{"GATEHOUSE_CAPI_BOOTSTRAP_IMAGE", "GATEHOUSE_CAPI_CONCURRENCY", "GATEHOUSE_CAPI_LOG_LEVEL"}
			if !slices.Equal(got, want) {
				t.Errorf("variables %q, want %q", got, want)
			}
			if _, err := withDefaults(raw); err != nil {
				t.Error(err)
			}
		}},
		{"the manager runs the default image with leader election", func(t *testing.T) {
			c := managerContainer(t, objs)
			if c["image"] != "ghcr.io/gatehouse-dev/gatehouse-capi-bootstrap:v0.1.0" {
				t.Errorf("image %v", c["image"])
			}
			args := managerArgs(t, objs)
			for _, want := range []string{"--leader-elect=true", "--concurrency=10", "--health-probe-bind-address=:8081"} {
				if !slices.Contains(args, want) {
					t.Errorf("args %q lack %s", args, want)
				}
			}
			for _, a := range args {
				if strings.HasPrefix(a, "--namespace") {
					t.Errorf("args %q restrict the watched namespace; clusterctl installs providers watching all", args)
				}
			}
		}},
		{"the manager is locked down", func(t *testing.T) {
			c := managerContainer(t, objs)
			pod, _, _ := unstructured.NestedMap(find(t, objs, "Deployment", appName).Object, "spec", "template", "spec")
			for _, f := range []struct {
				obj  map[string]any
				path []string
				want any
			}{
				{pod, []string{"securityContext", "runAsNonRoot"}, true},
				{pod, []string{"securityContext", "seccompProfile", "type"}, "RuntimeDefault"},
				{c, []string{"securityContext", "readOnlyRootFilesystem"}, true},
				{c, []string{"securityContext", "allowPrivilegeEscalation"}, false},
				{c, []string{"securityContext", "capabilities", "drop"}, []any{"ALL"}},
				{c, []string{"livenessProbe", "httpGet", "path"}, "/healthz"},
				{c, []string{"readinessProbe", "httpGet", "path"}, "/readyz"},
				{c, []string{"resources", "limits", "memory"}, "512Mi"},
			} {
				got, _, _ := unstructured.NestedFieldNoCopy(f.obj, f.path...)
				if !equalJSON(got, f.want) {
					t.Errorf("%s = %v, want %v", strings.Join(f.path, "."), got, f.want)
				}
			}
		}},
	} {
		t.Run(tc.name, tc.check)
	}
}

func equalJSON(a, b any) bool {
	ja, errA := yaml.Marshal(a)
	jb, errB := yaml.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// TestReadInputsErrors: bad inputs stop the generator with the reason.
func TestReadInputsErrors(t *testing.T) {
	crd, err := os.ReadFile(filepath.Join(repoRoot, "config", "crd", "bootstrap.gatehouse.dev_kubeadmconfigs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, crd, role, version, want string
	}{
		{"a version that is not vMAJOR.MINOR.PATCH", string(crd), string(role), "0.1.0", "is not vMAJOR.MINOR.PATCH"},
		{"a pre-release version", string(crd), string(role), "v0.1.0-rc.1", "is not vMAJOR.MINOR.PATCH"},
		{"no CRDs", "", string(role), defaultVersion, "no CRDs"},
		{"a CRD field the API does not know", strings.Replace(string(crd), "  scope: Namespaced", "  scope: Namespaced\n  scop: x", 1), string(role), defaultVersion, `unknown field "scop"`},
		{"a role under another name", string(crd), strings.Replace(string(role), "name: "+managerName, "name: manager-role", 1), defaultVersion, `"manager-role", want ClusterRole`},
		{"no role (controller-gen writes none without markers)", string(crd), "", defaultVersion, "found no +kubebuilder:rbac markers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			crdDir := filepath.Join(dir, "crd")
			if err := os.Mkdir(crdDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.crd != "" {
				if err := os.WriteFile(filepath.Join(crdDir, "x.yaml"), []byte(tc.crd), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			rolePath := filepath.Join(dir, "role.yaml")
			if tc.role != "" {
				if err := os.WriteFile(rolePath, []byte(tc.role), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, err := readInputs(crdDir, rolePath, tc.version)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
