package mirror

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

func TestContainerdHostsFile(t *testing.T) {
	m := &Mirror{Registry: "mirror.example:5000/k8s"}
	for _, tc := range []struct {
		upstream, server, host string
		plain                  bool
	}{
		{"registry.k8s.io", "https://registry.k8s.io", `[host."https://mirror.example:5000/v2/k8s/registry.k8s.io"]`, false},
		{"docker.io", "https://registry-1.docker.io", `[host."http://mirror.example:5000/v2/k8s/docker.io"]`, true},
		{"registry.example:5000", "https://registry.example:5000", `[host."https://mirror.example:5000/v2/k8s/registry.example_5000"]`, false},
	} {
		got, err := m.ContainerdHosts(tc.upstream, tc.plain)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`server = "` + tc.server + `"`, tc.host, "override_path = true"} {
			if !strings.Contains(string(got), want) {
				t.Errorf("hosts.toml of %s lacks %s:\n%s", tc.upstream, want, got)
			}
		}
	}
	if _, err := m.ContainerdHosts("registry.k8s.io/x", false); err == nil {
		t.Error("an upstream with a path was accepted")
	}
	if _, err := (&Mirror{Files: "https://f.example"}).ContainerdHosts("docker.io", false); err == nil {
		t.Error("a mirror without a registry gave hosts")
	}
}

// TestContainerdPullsFromTheMirror: a real containerd (the one the local
// cluster's nodes run) given ContainerdHosts for registry.k8s.io fetches
// registry.k8s.io's names from the mirror's registry (a real CNCF
// registry) at the mapped path, and refuses a digest the mirror does not
// serve; without the hosts file the same name cannot be fetched.
func TestContainerdPullsFromTheMirror(t *testing.T) {
	testenv.RequireRoot(t)
	requireContainerd(t)
	reg := testenv.StartRegistry(t)
	m := &Mirror{Registry: reg + "/mirror"}
	const ref = "registry.k8s.io/pause:gatehouse-mirror-test"
	_, digest := pushRandom(t, m, ref)
	hosts := t.TempDir()
	data, err := m.ContainerdHosts("registry.k8s.io", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(hosts, "registry.k8s.io"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hosts, "registry.k8s.io", "hosts.toml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := startContainerd(t)
	fetch := func(ref string, hostsDir ...string) (string, error) {
		args := []string{"--address", sock, "--namespace", "mirror-test", "content", "fetch"}
		for _, d := range hostsDir {
			args = append(args, "--hosts-dir", d)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ctr", append(args, ref)...).CombinedOutput()
		return string(out), err
	}
	if out, err := fetch(ref, hosts); err != nil || !strings.Contains(out, digest.Hex) {
		t.Fatalf("containerd did not fetch %s (%s) from the mirror: %v\n%s", ref, digest, err, out)
	}
	other, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	otherDigest, _ := other.Digest()
	if out, err := fetch("registry.k8s.io/pause@"+otherDigest.String(), hosts); err == nil {
		t.Fatalf("containerd fetched a digest the mirror does not serve:\n%s", out)
	}
	if out, err := fetch(ref); err == nil {
		t.Fatalf("without the hosts file containerd fetched %s from elsewhere:\n%s", ref, out)
	}
}

// startContainerd runs a containerd of its own (root, state and socket in
// temporary directories, no CRI) until the test ends and returns its
// socket.
func startContainerd(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "containerd.sock")
	config := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(config, []byte(`version = 2
root = "`+filepath.Join(dir, "root")+`"
state = "`+filepath.Join(dir, "state")+`"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "`+sock+`"
[ttrpc]
  address = "`+sock+`.ttrpc"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "containerd", "--config", config)
	logFile, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		_ = logFile.Close()
	})
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return exec.CommandContext(ctx, "ctr", "--address", sock, "version").Run() == nil, nil
	})
	if err != nil {
		log, _ := os.ReadFile(logFile.Name())
		t.Fatalf("containerd did not answer within 30 s: %v\n%s", err, log)
	}
	return sock
}

// TestContainerdPullsWithNodeFiles: a real containerd given the files a
// node writes for a plain-HTTP mirror (ContainerdHostsFiles) fetches both
// an upstream's name (registry.k8s.io/...) and the mirror's own name (as
// kubeadm names the control plane's images with imageRepository) from a
// real CNCF registry over HTTP.
func TestContainerdPullsWithNodeFiles(t *testing.T) {
	testenv.RequireRoot(t)
	requireContainerd(t)
	reg := testenv.StartRegistry(t)
	m := &Mirror{Registry: reg, PlainHTTP: true}
	const upstreamRef = "registry.k8s.io/kube-apiserver:gatehouse-node-files-test"
	mapped, digest := pushRandom(t, m, upstreamRef)
	files, err := ContainerdHostsFiles(m.NodeImageMirror())
	if err != nil {
		t.Fatal(err)
	}
	write := func() string {
		dir := t.TempDir()
		for upstream, data := range files {
			if err := os.MkdirAll(filepath.Join(dir, upstream), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, upstream, "hosts.toml"), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	sock := startContainerd(t)
	fetch := func(ref, hostsDir string) (string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ctr", "--address", sock, "--namespace", "node-files-test", "content", "fetch", "--hosts-dir", hostsDir, ref).CombinedOutput()
		return string(out), err
	}
	all := write()
	for _, ref := range []string{upstreamRef, mapped} {
		if out, err := fetch(ref, all); err != nil || !strings.Contains(out, digest.Hex) {
			t.Errorf("containerd did not fetch %s (%s) from the mirror: %v\n%s", ref, digest, err, out)
		}
	}
	// (containerd falls back to HTTP for a loopback registry by itself,
	// so the mirror's own file is checked by the hosts it holds, in
	// TestContainerdHostsFiles, and on the local cluster's bridge address
	// by test/e2e's TestMirrorInstall.)
}

// requireContainerd fails (in CI) or skips the test when containerd or
// ctr is missing.
func requireContainerd(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"containerd", "ctr"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing: apt-get install containerd (make setup does)", tool)
			}
			t.Skipf("%s is missing: apt-get install containerd (make setup does)", tool)
		}
	}
}

// pushRandom pushes a random image to m's registry at ref's mirror path
// and returns that path and the image's digest.
func pushRandom(t *testing.T, m *Mirror, ref string) (string, v1.Hash) {
	t.Helper()
	mapped, err := m.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := name.ParseReference(mapped, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img); err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return mapped, digest
}
