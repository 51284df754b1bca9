package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const good = `
kubernetes:
  v1.36.4:
    kubelet: {amd64: {url: https://x/amd64/kubelet, sha256: %[1]s}, arm64: {url: https://x/arm64/kubelet, sha256: %[1]s}}
    kubeadm: {amd64: {url: https://x/amd64/kubeadm, sha256: %[1]s}, arm64: {url: https://x/arm64/kubeadm, sha256: %[1]s}}
    kubectl: {amd64: {url: https://x/amd64/kubectl, sha256: %[1]s}, arm64: {url: https://x/arm64/kubectl, sha256: %[1]s}}
  v1.36.3:
    kubelet: {amd64: {url: https://x/amd64/kubelet, sha256: %[1]s}, arm64: {url: https://x/arm64/kubelet, sha256: %[1]s}}
    kubeadm: {amd64: {url: https://x/amd64/kubeadm, sha256: %[1]s}, arm64: {url: https://x/arm64/kubeadm, sha256: %[1]s}}
    kubectl: {amd64: {url: https://x/amd64/kubectl, sha256: %[1]s}, arm64: {url: https://x/arm64/kubectl, sha256: %[1]s}}
crictl:
  v1.35.0: {amd64: {url: https://x/crictl-amd64.tgz, sha256: %[1]s}, arm64: {url: https://x/crictl-arm64.tgz, sha256: %[1]s}}
cni-plugins:
  v1.9.1: {amd64: {url: https://x/cni-amd64.tgz, sha256: %[1]s}, arm64: {url: https://x/cni-arm64.tgz, sha256: %[1]s}}
`

func parse(t *testing.T, s string) data {
	t.Helper()
	var d data
	if err := yaml.Unmarshal([]byte(s), &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestBuild(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	releases, err := build(parse(t, strings.ReplaceAll(good, "%[1]s", digest)))
	if err != nil {
		t.Fatal(err)
	}
	if len(releases) != 1 || releases[0].Version != "v1.36.4" || releases[0].Crictl != "v1.35.0" {
		t.Fatalf("releases %+v: want only the newest patch, with the closest crictl", releases)
	}
	for name, tc := range map[string]struct{ data, want string }{
		"bad digest":   {strings.ReplaceAll(good, "%[1]s", "ABC"), "not 64 lowercase hex"},
		"missing arch": {strings.Replace(strings.ReplaceAll(good, "%[1]s", digest), ", arm64: {url: https://x/arm64/kubeadm, sha256: "+digest+"}", "", 1), "no arm64 artifact"},
		"bad version":  {strings.Replace(strings.ReplaceAll(good, "%[1]s", digest), "v1.36.3:", "1.36.3:", 1), "not vMAJOR.MINOR.PATCH"},
	} {
		if _, err := build(parse(t, tc.data)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, tc.want)
		}
	}
}

// TestGeneratedIsCurrent: the committed table is what the generator makes
// from the committed data file.
func TestGeneratedIsCurrent(t *testing.T) {
	dir := filepath.Join("..", "..", "internal", "versions")
	out := filepath.Join(t.TempDir(), "zz_generated.go")
	if err := run(filepath.Join(dir, "kubernetes-components.yaml"), out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, "zz_generated.go"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("internal/versions/zz_generated.go is out of date: run go generate ./internal/versions")
	}
}
