package cli

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
	"github.com/gatehouse-dev/gatehouse/internal/release"
)

func TestReleaseKeygenAndVerifyArguments(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "release.key"), filepath.Join(dir, "release.pub")
	run := func(args ...string) (string, error) {
		cmd := NewRootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("release", "keygen", "--private-key", priv, "--public-key", pub)
	if err != nil {
		t.Fatalf("keygen: %v: %s", err, out)
	}
	if strings.Contains(out, "PRIVATE KEY") { // the PEM's label: no key is printed
		t.Errorf("keygen printed the private key: %s", out)
	}
	if fi, err := os.Stat(priv); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("private key file: %v, mode %v; want 0600", err, fi.Mode())
	}
	privPEM, err := os.ReadFile(priv)
	if err != nil {
		t.Fatal(err)
	}
	keyBody := strings.Split(string(privPEM), "\n")[1] // the base64 of the key
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"keygen never overwrites a key", []string{"release", "keygen", "--private-key", priv, "--public-key", pub}, "an existing key is never overwritten"},
		{"the private key is not a public key", []string{"release", "verify", dir, "--key", priv}, "release key " + priv},
		{"a missing key file is named", []string{"release", "verify", dir, "--key", filepath.Join(dir, "nope.pub")}, "reading the release key"},
		{"a directory that is no release is refused naming SHA256SUMS", []string{"release", "verify", dir, "--key", pub}, "release refused: SHA256SUMS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := run(tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("%v = %v (%s), want an error containing %q", tt.args, err, out, tt.wantErr)
			}
			if strings.Contains(err.Error(), keyBody) {
				t.Errorf("the error holds key material: %v", err)
			}
		})
	}
}

// smallRelease builds a release of the repository's charts whose images
// run gatehouse-pause (small and static): what verification checks.
func smallRelease(t *testing.T) (dir, pub string) {
	t.Helper()
	privPEM, pubPEM, err := cosignformat.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := cosignformat.LoadSigner(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub = filepath.Join(t.TempDir(), "release.pub")
	if err := os.WriteFile(pub, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(t.TempDir(), "v0.1.0")
	_, err = release.Build(t.Context(), release.Config{
		Version: "v0.1.0", Commit: "0123456789abcdef0123456789abcdef01234567", RepoDir: "..", OutDir: dir,
		Registry: "ghcr.io/gatehouse-dev", Arches: []string{runtime.GOARCH},
		Commands: []release.Command{{Name: "gatehouse-pause", Package: "./cmd/gatehouse-pause"}},
		Images: []release.ImageSpec{{Name: "gatehouse-capi-bootstrap", Command: "gatehouse-pause"},
			{Name: "gatehouse-joinservice", Command: "gatehouse-pause"}, {Name: "gatehouse-keyservice", Command: "gatehouse-pause"}},
		Charts: []release.ChartSpec{{Name: "gatehouse-joinservice", Image: "gatehouse-joinservice"},
			{Name: "gatehouse-keyservice", Image: "gatehouse-keyservice"}},
		ClusterctlImage: "gatehouse-capi-bootstrap", Signer: signer,
		Epoch: time.Unix(1700000000, 0).UTC(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir, pub
}

// upgrade apply --release verifies the whole release before it reaches
// the cluster: a refused release stops it before the kubeconfig is even
// read, so nothing is installed; a verified one goes on to the cluster
// (here none: the kubeconfig is missing) with the release's charts.
func TestUpgradeApplyRelease(t *testing.T) {
	built, pub := smallRelease(t)
	_, otherPub := smallRelease(t)
	missingKubeconfig := filepath.Join(t.TempDir(), "admin.conf")
	tests := []struct {
		name   string
		tamper func(t *testing.T, dir string)
		key    string
		args   []string
		// wantErr is in the error; refused says it is a refusal.
		wantErr string
		refused bool
		// wantOut is in the output.
		wantOut string
	}{
		{name: "a verified release reaches the cluster", tamper: func(*testing.T, string) {}, wantErr: missingKubeconfig,
			wantOut: "runs ghcr.io/gatehouse-dev/gatehouse-keyservice@sha256:"},
		{name: "copies of the images in another registry, by the same digest", tamper: func(*testing.T, string) {},
			args: []string{"--release-registry", "registry.example:5000/mirror"}, wantErr: missingKubeconfig,
			wantOut: "runs registry.example:5000/mirror/gatehouse-keyservice@sha256:"},
		{name: "a changed chart is refused", tamper: func(t *testing.T, dir string) {
			flip(t, filepath.Join(dir, "charts", "gatehouse-joinservice-0.1.0.tgz"))
		}, wantErr: "release refused: charts/gatehouse-joinservice-0.1.0.tgz", refused: true},
		{name: "a changed image is refused", tamper: func(t *testing.T, dir string) {
			flip(t, filepath.Join(dir, "images", "gatehouse-keyservice.oci.tar"))
		}, wantErr: "release refused: images/gatehouse-keyservice.oci.tar", refused: true},
		{name: "an unsigned chart is refused", tamper: func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "charts", "gatehouse-keyservice-0.1.0.tgz.sig")); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "release refused: charts/gatehouse-keyservice-0.1.0.tgz: unsigned", refused: true},
		{name: "another key is refused", tamper: func(*testing.T, string) {}, key: otherPub,
			wantErr: "release refused: SHA256SUMS: signature does not verify", refused: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "release")
			if out, err := exec.Command("cp", "-a", built, dir).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v: %s", err, out)
			}
			tt.tamper(t, dir)
			key := pub
			if tt.key != "" {
				key = tt.key
			}
			cmd := NewRootCmd()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(append([]string{"upgrade", "apply", "--release", dir, "--release-key", key, "--kubeconfig", missingKubeconfig, "--backup-dir", t.TempDir()}, tt.args...))
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("upgrade apply = %v, want an error containing %q\n%s", err, tt.wantErr, out.String())
			}
			charts := strings.Contains(out.String(), "Chart gatehouse-joinservice 0.1.0 runs ")
			if tt.wantOut != "" && !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("the output lacks %q:\n%s", tt.wantOut, out.String())
			}
			if tt.refused == charts {
				t.Errorf("refused %t, but the release's charts were loaded %t:\n%s", tt.refused, charts, out.String())
			}
		})
	}
}

func flip(t *testing.T, file string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// mini up --release verifies the whole release before the cluster is
// made: a refused release leaves no cluster directory and loads nothing;
// a verified one goes on to mini's own checks (here refused by an
// out-of-range --workers, so no cluster starts in a unit test).
func TestMiniUpRelease(t *testing.T) {
	built, pub := smallRelease(t)
	tests := []struct {
		name    string
		tamper  func(t *testing.T, dir string)
		wantErr string
		refused bool
	}{
		{name: "a verified release reaches mini's checks", tamper: func(*testing.T, string) {}, wantErr: "--workers 999"},
		{name: "a changed image layer is refused", tamper: func(t *testing.T, dir string) {
			flip(t, filepath.Join(dir, "images", "gatehouse-joinservice.oci.tar"))
		}, wantErr: "release refused: images/gatehouse-joinservice.oci.tar", refused: true},
		{name: "a changed chart is refused", tamper: func(t *testing.T, dir string) {
			flip(t, filepath.Join(dir, "charts", "gatehouse-keyservice-0.1.0.tgz"))
		}, wantErr: "release refused: charts/gatehouse-keyservice-0.1.0.tgz", refused: true},
		{name: "an unsigned image archive is refused", tamper: func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "images", "gatehouse-keyservice.oci.tar.sig")); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "release refused: images/gatehouse-keyservice.oci.tar: unsigned", refused: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "release")
			if out, err := exec.Command("cp", "-a", built, dir).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v: %s", err, out)
			}
			tt.tamper(t, dir)
			clusterDir := filepath.Join(t.TempDir(), "cluster")
			cmd := NewRootCmd()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs([]string{"mini", "up", "--release", dir, "--release-key", pub, "--dir", clusterDir, "--workers", "999"})
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("mini up = %v, want an error containing %q\n%s", err, tt.wantErr, out.String())
			}
			loaded := strings.Contains(out.String(), "Chart gatehouse-joinservice 0.1.0 runs ghcr.io/gatehouse-dev/gatehouse-joinservice@sha256:")
			if tt.refused == loaded {
				t.Errorf("refused %t, but the release's charts and images were loaded %t:\n%s", tt.refused, loaded, out.String())
			}
			if _, err := os.Stat(clusterDir); !os.IsNotExist(err) {
				t.Errorf("the cluster directory exists (%v): something was made", err)
			}
		})
	}
}

// Two answers to where the images come from are refused, not merged: a
// --release-registry and the cluster configuration's mirror.registry.
func TestUpgradeApplyReleaseRegistryAndMirror(t *testing.T) {
	built, pub := smallRelease(t)
	n := startNode(t)
	n.patch = func(config string) string { return config + "\nmirror:\n  registry: mirror.example:5000\n" }
	dir := t.TempDir()
	config := writeConfig(t, dir, n, false)
	cmd := NewRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"upgrade", "apply", "--release", built, "--release-key", pub, "--release-registry", "registry.example:5000/copies",
		"--config", config, "--kubeconfig", filepath.Join(dir, "admin.conf"), "--backup-dir", t.TempDir()})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "--release-registry and the configuration's mirror.registry both say where the images come from") {
		t.Fatalf("upgrade apply = %v, want the two registries refused\n%s", err, out.String())
	}
}
