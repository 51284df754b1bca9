package mini

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestKubeletBinary: a node runs the host's kubelet only when the kubelet
// the bootstrapper installed has the same bytes.
func TestKubeletBinary(t *testing.T) {
	// Over one read chunk, so the comparison reads more than once.
	build := bytes.Repeat([]byte("kubelet build\n"), 200_000)
	changedLate := bytes.Clone(build)
	changedLate[len(changedLate)-2] = '!'
	for _, tc := range []struct {
		name      string
		installed []byte // nil: not installed
		host      []byte // nil: none on the host
		link      bool   // the host's kubelet is a link to its build, as in the pinned binaries
		wantHost  bool
	}{
		{name: "the same build runs from the host", installed: build, host: build, wantHost: true},
		{name: "through the host's link to the multi-call binary", installed: build, host: build, link: true, wantHost: true},
		{name: "another build runs as installed", installed: changedLate, host: build},
		{name: "a shorter one runs as installed", installed: build[:len(build)-1], host: build},
		{name: "no host build: as installed", installed: build},
		{name: "nothing installed yet: the installed path, which fails to start as before", host: build},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			installed, host := filepath.Join(dir, "installed-kubelet"), filepath.Join(dir, "kubelet")
			if tc.installed != nil {
				if err := os.WriteFile(installed, tc.installed, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.host != nil {
				target := host
				if tc.link {
					target = filepath.Join(dir, "kube")
					if err := os.Symlink("kube", host); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.WriteFile(target, tc.host, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			want := installed
			if tc.wantHost {
				want = host
			}
			if got := kubeletBinary(installed, host); got != want {
				t.Errorf("kubeletBinary = %s, want %s", got, want)
			}
		})
	}
}

// TestKubeletBinaryAfterUpgrade: a kubelet the upgrade installed (the
// upgrade build's bytes) runs from the host's upgrade build, so the nodes
// keep sharing one copy; one of neither build runs as installed.
func TestKubeletBinaryAfterUpgrade(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	old, next := write("kubelet-1.35", "v1.35 build"), write("kubelet-1.36", "v1.36 build")
	if got := kubeletBinary(write("installed", "v1.36 build"), old, next); got != next {
		t.Errorf("an upgraded kubelet runs from %s, want the host's upgrade build %s", got, next)
	}
	installed := write("other", "another build")
	if got := kubeletBinary(installed, old, next); got != installed {
		t.Errorf("a kubelet of neither build runs from %s, want %s", got, installed)
	}
}
