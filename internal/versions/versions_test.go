package versions

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/components"
)

func TestSupported(t *testing.T) {
	want := []string{"v1.36.4", "v1.35.8", "v1.34.11", "v1.33.11"}
	if got := Supported(); !slices.Equal(got, want) {
		t.Fatalf("supported %v, want the newest patch of each minor in the data file: %v", got, want)
	}
	if Default().Version != "v1.36.4" {
		t.Fatalf("default %s", Default().Version)
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "1.35", want: "v1.35.8"},
		{in: "v1.35", want: "v1.35.8"},
		{in: "v1.36.4", want: "v1.36.4"},
		{in: "1.34.11", want: "v1.34.11"},
		{in: "v1.35.7", err: "not supported"},
		{in: "1.32", err: "not supported: supported are v1.36.4, v1.35.8, v1.34.11, v1.33.11"},
		{in: "latest", err: "malformed"},
		{in: "v2.0.0", err: "malformed"},
		{in: "1.36.4-rc.0", err: "malformed"},
		{in: "", err: "malformed"},
	} {
		r, err := Resolve(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Resolve(%q) = %v, %v; want an error containing %q", tc.in, r.Version, err, tc.err)
		case tc.err == "" && (err != nil || r.Version != tc.want):
			t.Errorf("Resolve(%q) = %v, %v; want %s", tc.in, r.Version, err, tc.want)
		}
	}
}

// TestComponents: every release has the five components in install order
// for both architectures, each valid for the installer and matching its
// release's version and architecture.
func TestComponents(t *testing.T) {
	for _, v := range Supported() {
		r, err := Resolve(v)
		if err != nil {
			t.Fatal(err)
		}
		for _, arch := range architectures {
			list, err := r.Components(arch)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, c := range list {
				names = append(names, c.Name)
				if !strings.Contains(c.URL, arch) {
					t.Errorf("%s %s %s: URL %s is not for %s", v, arch, c.Name, c.URL, arch)
				}
				if strings.HasPrefix(c.Name, "kube") && !strings.Contains(c.URL, "/"+v+"/") {
					t.Errorf("%s %s: URL %s is not for %s", v, c.Name, c.URL, v)
				}
			}
			if got := strings.Join(names, ","); got != "kubelet,kubeadm,kubectl,crictl,cni-plugins" {
				t.Errorf("%s %s: components %s", v, arch, got)
			}
			protos, err := r.Proto(arch)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range protos {
				if err := components.Validate(p); err != nil {
					t.Errorf("%s %s: %v", v, arch, err)
				}
			}
		}
	}
	if _, err := Default().Components("riscv64"); err == nil || !strings.Contains(err.Error(), "amd64, arm64") {
		t.Fatalf("unknown architecture: %v", err)
	}
}

func TestCheckUpgrade(t *testing.T) {
	for _, tc := range []struct {
		from, to, err string
	}{
		{from: "v1.35.8", to: "1.36"},
		{from: "v1.35.4", to: "v1.35.8"},
		{from: "v1.35.4", to: "1.36"}, // a patch behind: kubeadm upgrades across it
		{from: "v1.36.4", to: "1.36"}, // the same: a roll resumed
		{from: "v1.36.4", to: "1.35", err: "older than the cluster's v1.36.4: Kubernetes cannot be downgraded"},
		{from: "v1.36.5", to: "1.36", err: "cannot be downgraded"},
		{from: "v1.34.11", to: "1.36", err: "v1.36.4 skips a minor version: the cluster runs v1.34.11 and Kubernetes upgrades one minor version at a time; upgrade to v1.35.8 first"},
		{from: "v1.30.1", to: "1.33", err: "upgrade to 1.31 first"},
		{from: "1.35", to: "1.36", err: "the cluster's version: kubernetes version \"1.35\" is not a release version"},
		{from: "garbage", to: "1.36", err: "not a release version"},
	} {
		to, err := Resolve(tc.to)
		if err != nil {
			t.Fatal(err)
		}
		err = CheckUpgrade(tc.from, to)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("CheckUpgrade(%s, %s) = %v, want nil", tc.from, to.Version, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("CheckUpgrade(%s, %s) = %v, want an error containing %q", tc.from, to.Version, err, tc.err)
		}
	}
}

// TestLocalBuild: the three binaries a local build provides, each the
// multi-call binary's file:// URL with its real digest, at the versions
// table's install paths; a missing build is named.
func TestLocalBuild(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kube"), []byte("kube"), 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := Default().LocalBuild("amd64", dir)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, c := range list {
		paths = append(paths, c.GetInstallPath())
		if c.GetUrl() != "file://"+filepath.Join(dir, "kube") || c.GetHash() != sha256Hex("kube") {
			t.Errorf("component %v", c)
		}
	}
	if !slices.Equal(paths, []string{"/usr/local/bin/kubelet", "/usr/local/bin/kubeadm", "/usr/local/bin/kubectl"}) {
		t.Errorf("install paths %v", paths)
	}
	if _, err := Default().LocalBuild("amd64", filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "the local Kubernetes build") {
		t.Errorf("a missing build: %v", err)
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}
