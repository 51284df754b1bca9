package main

import (
	"bytes"
	"encoding/json"
	"io/fs"
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

// TestReleaseReproducible builds the release twice, from this checkout,
// into two directories and compares them byte for byte (docs/development.md,
// "Releases"). Both builds share the Go build cache (content-addressed:
// a hit gives the bytes a compile would), so the second costs about a
// minute; cold, the first compiles the binaries with -trimpath (about 4
// min on 2 cores). It builds for the host's architecture: the arm64
// cross-build is the same go build with GOARCH set (make release builds
// both). The node image is a small fixed input.
func TestReleaseReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary twice")
	}
	priv, pub, err := cosignformat.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	node := t.TempDir()
	for name, data := range map[string]string{"manifest.json": "{\"fixed\": true}\n", "node-worker.raw": "a fixed disk"} {
		if err := os.WriteFile(filepath.Join(node, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	key := filepath.Join(t.TempDir(), "release.key")
	if err := os.WriteFile(key, priv, 0o600); err != nil {
		t.Fatal(err)
	}
	// The builder runs as make release runs it, outside the race-detecting
	// test binary (compressing and signing hundreds of MB under -race takes
	// many minutes).
	builder := filepath.Join(t.TempDir(), "release")
	if out, err := exec.Command("go", "build", "-o", builder, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build ./hack/release: %v: %s", err, out)
	}
	var dirs []string
	for i := range 2 {
		dir := filepath.Join(t.TempDir(), "v0.1.0")
		start := time.Now()
		cmd := exec.Command(builder, "-version", "v0.1.0", "-commit", "0123456789abcdef0123456789abcdef01234567", "-epoch", "1700000000",
			"-key", key, "-out", dir, "-node-image", node, "-arch", runtime.GOARCH, "-repo", "../..")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("build %d: %v: %s", i+1, err, stderr.String())
		}
		if strings.Contains(stderr.String(), "PRIVATE KEY") {
			t.Errorf("the builder's output holds the private key")
		}
		t.Logf("build %d took %s", i+1, time.Since(start).Round(time.Second))
		dirs = append(dirs, dir)
	}
	a, b := tree(t, dirs[0]), tree(t, dirs[1])
	if len(a) != len(b) {
		t.Errorf("the builds hold %d and %d files", len(a), len(b))
	}
	for name, data := range a {
		if other, ok := b[name]; !ok || !bytes.Equal(data, other) {
			t.Errorf("%s differs between the two builds", name)
		}
	}
	if len(a) < 40 {
		t.Errorf("the release holds %d files: too few for every binary, image, chart and their SBOMs and signatures", len(a))
	}
	// The released CLI verifies its own release (outside the race-detecting
	// test binary: hashing and checking 250 MB under -race takes a minute)
	// and names the images it was released with.
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		return
	}
	cli := filepath.Join(dirs[0], "bin", "linux-"+runtime.GOARCH, "gatehouse")
	pubFile := filepath.Join(t.TempDir(), "release.pub")
	if err := os.WriteFile(pubFile, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cli, "release", "verify", dirs[0], "--key", pubFile).CombinedOutput(); err != nil {
		t.Fatalf("gatehouse release verify: %v: %s", err, out)
	}
	var m release.Manifest
	if err := json.Unmarshal(a["release.json"], &m); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(cli, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("gatehouse version: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "Version:\tv0.1.0") || !strings.Contains(string(out), "0123456789abcdef") {
		t.Errorf("gatehouse version printed\n%s\nwant the release's version and commit", out)
	}
	if len(m.Images) != len(images) {
		t.Errorf("release.json lists %d images, want %d", len(m.Images), len(images))
	}
	for _, img := range m.Images {
		if !strings.Contains(string(out), img.Name+" "+img.Ref()) {
			t.Errorf("gatehouse version printed\n%s\nwant %s %s", out, img.Name, img.Ref())
		}
	}
}

// tree reads every file under dir by relative path.
func tree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files[rel], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
