package kubeadm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestMirrorImageNames: with imageRepository <registry>/registry.k8s.io
// (a mirror, docs/install-airgapped.md), the real kubeadm names every
// image of the rendered init configuration <registry>/ + its default name,
// CoreDNS's coredns/coredns path included; any other imageRepository
// keeps kubeadm's own naming.
func TestMirrorImageNames(t *testing.T) {
	bin := kubeadmBin(t)
	list := func(t *testing.T, args ...string) []string {
		t.Helper()
		out, err := exec.CommandContext(t.Context(), bin, append([]string{"config", "images", "list"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubeadm config images list %v: %v\n%s", args, err, out)
		}
		return strings.Fields(string(out))
	}
	defaults := list(t, "--kubernetes-version", "v1.36.4")
	for _, tc := range []struct {
		name, repo string
		want       func(image string) string // from a default name
	}{
		{"mirror", "mirror.example:5000/registry.k8s.io", func(image string) string { return "mirror.example:5000/" + image }},
		{"mirror with a prefix", "mirror.example/m/registry.k8s.io", func(image string) string { return "mirror.example/m/" + image }},
		{"local images", "docker.io/local", func(image string) string {
			return "docker.io/local/" + image[strings.LastIndex(image, "/")+1:]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := initParams("192.0.2.10")
			p.ImageRepository = tc.repo
			config, err := p.Render()
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "init.yaml")
			if err := os.WriteFile(file, config, 0o600); err != nil {
				t.Fatal(err)
			}
			got := list(t, "--config", file)
			want := make([]string, len(defaults))
			for i, image := range defaults {
				want[i] = tc.want(image)
			}
			if !slices.Equal(got, want) {
				t.Errorf("kubeadm names\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
