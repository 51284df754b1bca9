package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/capi/basetemplate"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

func runRoot(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestMirrorList: every file of the version (both architectures, mirror
// path, digest, official URL) and every image, the control plane's as the
// real kubeadm names them and the charts'.
func TestMirrorList(t *testing.T) {
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	release := versions.Default()
	out, err := runRoot(t, "mirror", "list", "--kubernetes", release.Version, "--kubeadm", filepath.Join(bin, "kubeadm"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		list, _ := release.Components(arch)
		for _, c := range list {
			line := "file " + strings.TrimPrefix(c.URL, "https://") + " " + c.Hash + " " + c.URL + "\n"
			if !strings.Contains(out, line) {
				t.Errorf("no line %q", line)
			}
		}
	}
	for _, img := range []string{"registry.k8s.io/kube-apiserver:" + release.Version, "registry.k8s.io/pause:", "registry.k8s.io/etcd:",
		"registry.k8s.io/coredns/coredns:", "gatehouse-joinservice:", "gatehouse-keyservice:"} {
		if !strings.Contains(out, img) {
			t.Errorf("no image %s in\n%s", img, out)
		}
	}
	if _, err := runRoot(t, "mirror", "list", "--kubeadm", filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "config images list") {
		t.Errorf("a missing kubeadm: %v", err)
	}
}

// TestMirrorTemplate: the written template is the provider's: it parses
// and names the mirror's URLs; it is not overwritten without --force.
func TestMirrorTemplate(t *testing.T) {
	dir := t.TempDir()
	release := versions.Default()
	if out, err := runRoot(t, "mirror", "template", dir, "--kubernetes", release.Version, "--mirror-files", "https://m.example/files"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	path := filepath.Join(dir, release.Version, basetemplate.FileName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := basetemplate.Parse(data, release.Version)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Architectures["arm64"][0].URL; !strings.HasPrefix(got, "https://m.example/files/dl.k8s.io/") {
		t.Fatalf("first arm64 URL %s is not the mirror's", got)
	}
	if _, err := runRoot(t, "mirror", "template", dir, "--kubernetes", release.Version); err == nil {
		t.Fatal("an existing template was overwritten without --force")
	}
	if _, err := runRoot(t, "mirror", "template", dir, "--mirror-files", "mirror.example"); err == nil || !strings.Contains(err.Error(), "not an http:// or https:// URL") {
		t.Fatalf("a malformed mirror: %v", err)
	}
}

// TestMirrorContainerdHosts: one hosts.toml per upstream, sending pulls to
// the mirror's mapped path (containerd itself pulls through them in
// internal/mirror's test).
func TestMirrorContainerdHosts(t *testing.T) {
	dir := t.TempDir()
	if out, err := runRoot(t, "mirror", "containerd-hosts", dir, "--registry", "mirror.example:5000", "--plain-http", "--upstream", "registry.k8s.io,ghcr.io"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for upstream, want := range map[string]string{
		"registry.k8s.io": `[host."http://mirror.example:5000/v2/registry.k8s.io"]`,
		"ghcr.io":         `[host."http://mirror.example:5000/v2/ghcr.io"]`,
	} {
		data, err := os.ReadFile(filepath.Join(dir, upstream, "hosts.toml"))
		if err != nil || !strings.Contains(string(data), want) {
			t.Errorf("%s/hosts.toml (%v) lacks %s:\n%s", upstream, err, want, data)
		}
	}
	if _, err := runRoot(t, "mirror", "containerd-hosts", dir, "--registry", "https://mirror.example"); err == nil {
		t.Error("a registry with a scheme was accepted")
	}
}

// TestUpgradeComponents: a roll hands the nodes kubelet, kubeadm and
// kubectl and the join configuration the whole list, through the cluster
// configuration's mirror when it names one (upgrade apply --config), the
// table's digests unchanged.
func TestUpgradeComponents(t *testing.T) {
	release := versions.Default()
	table, err := release.Proto("amd64")
	if err != nil {
		t.Fatal(err)
	}
	m := &mirror.Mirror{Files: "https://m.example/f"}
	for _, tc := range []struct {
		name   string
		m      *mirror.Mirror
		nodes  bool
		prefix string
		count  int
	}{
		{"nodes, official", nil, true, "https://dl.k8s.io/", 3},
		{"nodes, mirrored", m, true, "https://m.example/f/dl.k8s.io/", 3},
		{"join configuration, mirrored", m, false, "https://m.example/f/", len(table)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := upgradeComponents(release, "", tc.m, "amd64", tc.nodes)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.count {
				t.Fatalf("%d components, want %d", len(got), tc.count)
			}
			for i, c := range got {
				if !strings.HasPrefix(c.GetUrl(), tc.prefix) || c.GetHash() != table[i].GetHash() || c.GetExtract() != table[i].GetExtract() {
					t.Errorf("component %d = %v, want a URL under %s and the table's %v", i, c, tc.prefix, table[i])
				}
			}
		})
	}
}
