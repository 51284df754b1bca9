package main

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
	"github.com/gatehouse-dev/gatehouse/internal/release"
)

// TestReleaseReproducible builds the release twice, from this checkout,
// for linux/amd64 and linux/arm64, into two directories and compares them
// byte for byte (docs/development.md, "Releases"). Both builds share the
// Go build cache (content-addressed: a hit gives the bytes a compile
// would), so the second costs about a minute; cold, the first compiles
// every binary for both architectures with -trimpath, the cgo ones for
// the other architecture with Debian's cross gcc. It then checks each
// binary is an ELF file for its platform, that the key service's image
// carries, for each platform, the loader and libraries its binary needs,
// and runs the other platform's CLI and key service (from its image's
// files) under QEMU's user-mode emulator. The node image is a small fixed
// input.
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
			"-key", key, "-out", dir, "-node-image", node, "-arch", "amd64,arm64", "-repo", "../..")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			if i == 0 && os.Getenv("CI") == "" && strings.Contains(stderr.String(), "needs a C toolchain") {
				t.Skipf("no C cross toolchain (hack/setup.sh --test installs it): %s", stderr.String())
			}
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
	var m release.Manifest
	if err := json.Unmarshal(a["release.json"], &m); err != nil {
		t.Fatal(err)
	}
	checkBinaries(t, dirs[0], m)
	if len(m.Images) != len(images) {
		t.Errorf("release.json lists %d images, want %d", len(m.Images), len(images))
	}
	for _, img := range m.Images {
		if !slices.Equal(img.Platforms, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("image %s has platforms %v, want linux/amd64 and linux/arm64", img.Name, img.Platforms)
		}
	}
	keyservice := imageRoots(t, dirs[0], m, "gatehouse-keyservice")
	loaders := map[string]string{}
	for arch := range platforms() {
		root, ok := keyservice[arch]
		if !ok {
			t.Errorf("the key service's image has no linux/%s", arch)
			continue
		}
		if loaders[arch] = checkImageRuntime(t, root, arch, "gatehouse-keyservice"); loaders[arch] == "" {
			t.Errorf("the linux/%s key service is linked statically: it needs cgo (PKCS#11)", arch)
		}
	}
	if t.Failed() {
		return
	}
	// The released CLI verifies its own release (outside the race-detecting
	// test binary: hashing and checking 250 MB under -race takes a minute)
	// and names the images it was released with.
	pubFile := filepath.Join(t.TempDir(), "release.pub")
	if err := os.WriteFile(pubFile, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(dirs[0], "bin", "linux-"+runtime.GOARCH, "gatehouse")
	if out, err := exec.Command(host, "release", "verify", dirs[0], "--key", pubFile).CombinedOutput(); err != nil {
		t.Fatalf("gatehouse release verify: %v: %s", err, out)
	}
	// The key service runs from its image's files: here with the image's
	// own loader and libraries, elsewhere under QEMU with the image as its
	// root (-L). Then each platform's CLI prints the release's version.
	for _, arch := range []string{runtime.GOARCH, otherArch()} {
		root, bin := keyservice[arch], filepath.Join(keyservice[arch], "usr/local/bin/gatehouse-keyservice")
		args := []string{bin, "-print-encryption-config"}
		if arch == runtime.GOARCH {
			args = append([]string{filepath.Join(root, loaders[arch]), "--library-path", filepath.Join(root, "lib", platforms()[arch].triplet)}, args...)
		}
		if out := runOn(t, arch, root, args...); !strings.Contains(out, "kind: EncryptionConfiguration") {
			t.Errorf("the linux/%s key service printed\n%s\nwant an EncryptionConfiguration", arch, out)
		}
	}
	for _, arch := range []string{runtime.GOARCH, otherArch()} {
		out := runOn(t, arch, "/usr/"+platforms()[arch].triplet, filepath.Join(dirs[0], "bin", "linux-"+arch, "gatehouse"), "version")
		if !strings.Contains(out, "Version:\tv0.1.0") || !strings.Contains(out, "0123456789abcdef") {
			t.Errorf("the linux/%s gatehouse version printed\n%s\nwant the release's version and commit", arch, out)
		}
		for _, img := range m.Images {
			if !strings.Contains(out, img.Name+" "+img.Ref()) {
				t.Errorf("the linux/%s gatehouse version printed\n%s\nwant %s %s", arch, out, img.Name, img.Ref())
			}
		}
	}
}

// otherArch is the release platform that is not this machine's.
func otherArch() string {
	if runtime.GOARCH == "arm64" {
		return "amd64"
	}
	return "arm64"
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
