package mini

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/mini/images"
)

// TestLinkSeed: a node's copy of the containerd seed links content blobs
// and unpacked layers (containerd never changes them) and copies
// everything else (its databases), so a node writing its copy changes
// neither the seed nor another node's; modes (a layer's sticky /tmp) and
// symlinks are kept; what a seed never holds is refused, leaving nothing.
func TestLinkSeed(t *testing.T) {
	seed := filepath.Join(t.TempDir(), "seed")
	files := map[string]string{
		"io.containerd.metadata.v1.bolt/meta.db":                                   "metadata",
		"io.containerd.snapshotter.v1.overlayfs/metadata.db":                       "snapshots",
		"io.containerd.content.v1.content/blobs/sha256/0123":                       "blob",
		"io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/local/bin/kube": "binary",
	}
	for name, content := range files {
		p := filepath.Join(seed, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(seed, "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("kube", filepath.Join(seed, "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/local/bin/kubelet")); err != nil {
		t.Fatal(err)
	}

	nodes := t.TempDir()
	a, b := filepath.Join(nodes, "a", "containerd"), filepath.Join(nodes, "b", "containerd")
	for _, dst := range []string{a, b} {
		if err := linkSeed(seed, dst); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range files {
		got, err := os.ReadFile(filepath.Join(a, name))
		if err != nil || string(got) != content {
			t.Fatalf("%s: %q, %v; want %q", name, got, err, content)
		}
		same := sameFile(t, filepath.Join(seed, name), filepath.Join(a, name))
		if want := immutable(name); same != want {
			t.Errorf("%s linked: %v, want %v", name, same, want)
		}
	}
	// Node a writes its databases: the seed and node b are unchanged.
	if err := os.WriteFile(filepath.Join(a, "io.containerd.metadata.v1.bolt/meta.db"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{seed, b} {
		if got, _ := os.ReadFile(filepath.Join(root, "io.containerd.metadata.v1.bolt/meta.db")); string(got) != "metadata" {
			t.Errorf("%s's meta.db changed with another copy's: %q", root, got)
		}
	}
	if fi, err := os.Stat(filepath.Join(a, "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("the layer's /tmp is %v (%v), want drwxrwxrwt", fi.Mode(), err)
	}
	if link, err := os.Readlink(filepath.Join(a, "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/local/bin/kubelet")); err != nil || link != "kube" {
		t.Errorf("symlink: %q, %v", link, err)
	}

	// A fifo: not something a seed holds.
	if err := syscall.Mkfifo(filepath.Join(seed, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(nodes, "c", "containerd")
	if err := linkSeed(seed, c); err == nil {
		t.Fatal("a fifo was copied")
	}
	if entries, _ := os.ReadDir(filepath.Dir(c)); len(entries) != 0 {
		t.Fatalf("a failed copy left %v", entries)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(fa, fb)
}

// TestBuildSeed: the seed holds the archive's images in the k8s.io
// namespace, unpacked for the overlayfs snapshotter, as a node's
// containerd finds them; a second call keeps the first seed. A seed built
// from an earlier one holds exactly the new archive's images, and the
// layers both have are the earlier seed's (not unpacked again).
func TestBuildSeed(t *testing.T) {
	testenv.RequireRoot(t)
	for _, bin := range []string{"containerd", "ctr", "unshare"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s: apt-get install containerd (make setup does)", bin)
		}
	}
	dir := t.TempDir()
	binary := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pause, kube, etcd := binary("pause", "#!/bin/sh\nexit 0\n"), binary("kube", "#!/bin/sh\necho kube\n"), binary("etcd", "#!/bin/sh\necho etcd\n")
	archive := func(name string, specs ...images.Spec) (string, []string) {
		p := filepath.Join(dir, name)
		if err := images.WriteArchive(p, "amd64", specs); err != nil {
			t.Fatal(err)
		}
		var refs []string
		for _, s := range specs {
			refs = append(refs, s.Ref)
		}
		return p, refs
	}
	first, firstRefs := archive("first.tar",
		images.Spec{Ref: "docker.io/local/pause:test", Files: map[string]string{"pause": pause}},
		images.Spec{Ref: "docker.io/local/kube:1", Files: map[string]string{"kube": kube}})
	seed := filepath.Join(dir, "first.containerd")
	if err := buildSeed(t.Context(), first, firstRefs, seed, ""); err != nil {
		t.Fatal(err)
	}
	unpacked := func(seed, name string) string {
		t.Helper()
		snapshots, err := filepath.Glob(filepath.Join(seed, "io.containerd.snapshotter.v1.overlayfs/snapshots/*/fs/usr/local/bin", name))
		if err != nil || len(snapshots) != 1 {
			t.Fatalf("unpacked layers holding %s in %s: %v, %v; want one", name, seed, snapshots, err)
		}
		return snapshots[0]
	}
	if got, _ := os.ReadFile(unpacked(seed, "pause")); !bytes.Equal(got, []byte("#!/bin/sh\nexit 0\n")) {
		t.Fatalf("unpacked binary: %q", got)
	}
	if out := seedImages(t, seed); !strings.Contains(out, "docker.io/local/pause:test") || !strings.Contains(out, "docker.io/local/kube:1") {
		t.Fatalf("a containerd started on a copy of the seed lists:\n%s", out)
	}
	info, err := os.Stat(seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := buildSeed(t.Context(), first, firstRefs, seed, ""); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Stat(seed); !os.SameFile(info, again) {
		t.Fatal("a second build replaced the seed")
	}

	// A later archive: kube's image as before, etcd's new, pause's gone.
	second, secondRefs := archive("second.tar",
		images.Spec{Ref: "docker.io/local/kube:1", Files: map[string]string{"kube": kube}},
		images.Spec{Ref: "docker.io/local/etcd:1", Files: map[string]string{"etcd": etcd}})
	next := filepath.Join(dir, "second.containerd")
	if err := buildSeed(t.Context(), second, secondRefs, next, latestSeed(dir, next)); err != nil {
		t.Fatal(err)
	}
	out := seedImages(t, next)
	if !strings.Contains(out, "docker.io/local/kube:1") || !strings.Contains(out, "docker.io/local/etcd:1") || strings.Contains(out, "pause") {
		t.Fatalf("the later seed lists:\n%s\nwant exactly kube and etcd", out)
	}
	if !sameFile(t, unpacked(seed, "kube"), unpacked(next, "kube")) {
		t.Error("the layer both archives have was unpacked again")
	}
	unpacked(next, "etcd")
}

// seedImages lists the images a containerd started on a copy of seed has.
func seedImages(t *testing.T, seed string) string {
	t.Helper()
	node := filepath.Join(t.TempDir(), "node")
	if err := linkSeed(seed, node); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	sock := filepath.Join(state, "c.sock")
	config := filepath.Join(state, "config.toml")
	if err := os.WriteFile(config, []byte("version = 2\nroot = \""+node+"\"\nstate = \""+state+"\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \""+sock+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "containerd", "--config", config)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var out []byte
	err := poll(t.Context(), 50*time.Millisecond, 30*time.Second, "containerd on the copy", func() (bool, error) {
		var err error
		out, err = exec.Command("ctr", "--address", sock, "-n", "k8s.io", "images", "check").CombinedOutput()
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("containerd on a copy of the seed: %v\n%s", err, out)
	}
	return string(out)
}
