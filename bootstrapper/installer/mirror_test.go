package installer

import (
	"archive/tar"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

// TestInstallFromMirror: components mapped to a mirror (a file server laid
// out as <files>/<original host>/<original path>, docs/install-airgapped.md)
// install with their pinned digests; when the mirror serves one changed
// file, Install refuses it naming the install path, the mirror's URL, the
// pinned and the received digest, and installs nothing at all: not the
// changed file, not the good components before it, no temporary file.
func TestInstallFromMirror(t *testing.T) {
	kubelet, kubeadm := []byte("the real kubelet"), []byte("the real kubeadm")
	cni := tarGz(t, []entry{{name: "./bridge", typ: tar.TypeReg, body: "bridge plugin"}})
	official := []struct {
		url     string
		content []byte
		path    string
		extract bool
	}{
		{"https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", kubelet, "bin/kubelet", false},
		{"https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubeadm", kubeadm, "bin/kubeadm", false},
		{"https://github.com/containernetworking/plugins/releases/download/v1.9.1/cni-plugins-linux-amd64-v1.9.1.tgz", cni, "cni", true},
	}
	for _, tc := range []struct {
		name    string
		changed string // the file the mirror serves changed, "" for none
	}{
		{"the mirror serves the pinned files", ""},
		{"the mirror serves a changed kubeadm", "dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubeadm"},
		{"the mirror serves a changed archive", "github.com/containernetworking/plugins/releases/download/v1.9.1/cni-plugins-linux-amd64-v1.9.1.tgz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := t.TempDir()
			var list []*componentsv1.Component
			root := t.TempDir()
			for _, o := range official {
				rel := strings.TrimPrefix(o.url, "https://")
				content := o.content
				if rel == tc.changed {
					content = append([]byte("changed "), content...)
				}
				if err := os.MkdirAll(filepath.Dir(filepath.Join(files, rel)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(files, rel), content, 0o600); err != nil {
					t.Fatal(err)
				}
				list = append(list, &componentsv1.Component{Url: o.url, Hash: hashOf(o.content), InstallPath: filepath.Join(root, o.path), Extract: o.extract})
			}
			var mu sync.Mutex
			var requests []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				requests = append(requests, r.URL.Path)
				mu.Unlock()
				http.FileServer(http.Dir(files)).ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			m := &mirror.Mirror{Files: srv.URL + "/"}
			mapped, err := m.Components(list)
			if err != nil {
				t.Fatal(err)
			}
			err = newInstaller().Install(t.Context(), mapped)
			srv.Close()
			for _, p := range requests {
				if !strings.HasPrefix(p, "/dl.k8s.io/") && !strings.HasPrefix(p, "/github.com/") {
					t.Errorf("the installer asked the mirror for %s, outside the mapping", p)
				}
			}
			if tc.changed == "" {
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range official {
					if o.extract {
						assertOnly(t, filepath.Join(root, o.path), "bridge")
						continue
					}
					if got, err := os.ReadFile(filepath.Join(root, o.path)); err != nil || string(got) != string(o.content) {
						t.Fatalf("%s holds %q (%v), want %q", o.path, got, err, o.content)
					}
				}
				return
			}
			var changed *componentsv1.Component
			for i, o := range official {
				if strings.HasSuffix(o.url, tc.changed) {
					changed = mapped[i]
				}
			}
			for _, want := range []string{"installing " + changed.GetInstallPath(), srv.URL + "/" + tc.changed, "pinned " + changed.GetHash(), "has sha256:"} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("Install() = %v, want an error containing %q", err, want)
				}
			}
			assertOnly(t, filepath.Join(root, "bin"))
			if _, err := os.Stat(filepath.Join(root, "cni")); err == nil {
				assertOnly(t, filepath.Join(root, "cni"))
			}
		})
	}
}
