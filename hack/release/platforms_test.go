package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/gatehouse-dev/gatehouse/internal/release"
)

// platform is what the tests know of a release platform: its binaries'
// ELF machine, Debian's multiarch triplet (the directory of an image's
// libraries and of the cross sysroot /usr/<triplet>) and QEMU's user-mode
// emulator.
type platform struct {
	machine elf.Machine
	triplet string
	qemu    string
}

func platforms() map[string]platform {
	return map[string]platform{
		"amd64": {machine: elf.EM_X86_64, triplet: "x86_64-linux-gnu", qemu: "qemu-x86_64"},
		"arm64": {machine: elf.EM_AARCH64, triplet: "aarch64-linux-gnu", qemu: "qemu-aarch64"},
	}
}

// cgoCommands are the binaries that link PKCS#11 through cgo: dynamically
// linked against glibc on every platform; the others are static.
var cgoCommands = []string{"gatehouse", "gatehouse-bootstrapper", "gatehouse-keyservice"}

// checkBinaries checks that the release holds every command for every
// platform, each an ELF file for its platform's machine, linked
// dynamically exactly when it uses cgo.
func checkBinaries(t *testing.T, dir string, m release.Manifest) {
	t.Helper()
	built := map[string]bool{}
	for _, b := range m.Binaries {
		built[b.Name+" "+b.Platform] = true
	}
	for arch, p := range platforms() {
		for _, c := range commands {
			if !built[c.Name+" linux/"+arch] {
				t.Errorf("release.json lists no %s for linux/%s", c.Name, arch)
				continue
			}
			bin := filepath.Join(dir, "bin", "linux-"+arch, c.Name)
			machine, interp, _ := readELF(t, bin)
			if machine != p.machine {
				t.Errorf("%s is for %s, want %s", bin, machine, p.machine)
			}
			if cgo := slices.Contains(cgoCommands, c.Name); cgo != (interp != "") {
				t.Errorf("%s: program interpreter %q; want one exactly for a cgo binary (%v)", bin, interp, cgo)
			}
		}
	}
}

// readELF returns an ELF file's machine, program interpreter ("" if
// static) and needed libraries.
func readELF(t *testing.T, p string) (elf.Machine, string, []string) {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	defer f.Close()
	var interp string
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			data, err := io.ReadAll(prog.Open())
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			interp = string(bytes.TrimRight(data, "\x00"))
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return f.Machine, interp, needed
}

// imageRoots extracts each platform's file system of the release's image
// name into a directory, by architecture.
func imageRoots(t *testing.T, dir string, m release.Manifest, name string) map[string]string {
	t.Helper()
	img, ok := m.Image(name)
	if !ok {
		t.Fatalf("release.json lists no image %s", name)
	}
	lay := t.TempDir()
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(img.Path)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	extract(t, f, lay)
	root, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	h, err := v1.NewHash(img.Digest)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := root.ImageIndex(h)
	if err != nil {
		t.Fatalf("%s: the index %s: %v", img.Path, img.Digest, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	roots := map[string]string{}
	for _, d := range im.Manifests {
		i, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		layers, err := i.Layers()
		if err != nil {
			t.Fatal(err)
		}
		fs := t.TempDir()
		for _, l := range layers {
			r, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			extract(t, r, fs)
			r.Close()
		}
		roots[d.Platform.Architecture] = fs
	}
	return roots
}

// extract writes the regular files of the tar r under dir.
func extract(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg || !filepath.IsLocal(name) {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, os.FileMode(h.Mode)&0o777); err != nil {
			t.Fatal(err)
		}
	}
}

// checkImageRuntime checks that the binary of an image's platform is for
// that platform and that its loader and every library it needs,
// transitively, are in the image where glibc's loader looks
// (/lib/<triplet>, /usr/lib/<triplet>, /lib, /usr/lib), for the same
// machine. It returns the loader's path in the image, "" for a static
// binary.
func checkImageRuntime(t *testing.T, root, arch, binary string) string {
	t.Helper()
	p := platforms()[arch]
	machine, interp, needed := readELF(t, filepath.Join(root, "usr/local/bin", binary))
	if machine != p.machine {
		t.Errorf("the linux/%s image's %s is for %s, want %s", arch, binary, machine, p.machine)
	}
	if interp == "" {
		return ""
	}
	if m, _, _ := readELF(t, filepath.Join(root, interp)); m != p.machine {
		t.Errorf("the linux/%s image's loader %s is for %s", arch, interp, m)
	}
	seen := map[string]bool{path.Base(interp): true}
	for len(needed) > 0 {
		lib := needed[0]
		needed = needed[1:]
		if seen[lib] {
			continue
		}
		seen[lib] = true
		found := ""
		for _, d := range []string{"lib/" + p.triplet, "usr/lib/" + p.triplet, "lib", "usr/lib"} {
			if _, err := os.Stat(filepath.Join(root, d, lib)); err == nil {
				found = filepath.Join(root, d, lib)
				break
			}
		}
		if found == "" {
			t.Errorf("the linux/%s image of %s lacks %s, which it needs", arch, binary, lib)
			continue
		}
		m, _, more := readELF(t, found)
		if m != p.machine {
			t.Errorf("the linux/%s image's %s is for %s", arch, found, m)
		}
		needed = append(needed, more...)
	}
	return interp
}

// runOn runs a program of linux/arch: here when it is the machine's
// architecture, else under QEMU's user-mode emulator with the loader and
// libraries of sysroot (qemu -L), skipping (failing in CI) without QEMU.
func runOn(t *testing.T, arch, sysroot string, args ...string) string {
	t.Helper()
	if arch != runtime.GOARCH {
		q := platforms()[arch].qemu
		if _, err := exec.LookPath(q); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing: install qemu-user (hack/setup.sh --test)", q)
			}
			t.Skipf("%s is missing: install qemu-user to run the linux/%s binaries", q, arch)
		}
		args = append([]string{q, "-L", sysroot}, args...)
	}
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
