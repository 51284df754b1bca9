package release

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// cToolchain is the Debian C toolchain and glibc a cgo binary is built
// with and linked against for one architecture: the host's own gcc and
// libc6-dev for the host's architecture, Debian's cross compiler and its
// libc6-*-cross sysroot (/usr/<triplet>/lib) for another. Both kinds link
// dynamically against glibc; the image of such a binary carries the
// loader and libraries from the same place (docs/install.md, "Platforms").
type cToolchain struct {
	arch string
	// triplet is the GNU triplet and Debian multiarch name, e.g.
	// aarch64-linux-gnu: the loader of the image looks for libraries in
	// /lib/<triplet> (glibc's system directories as Debian builds it).
	triplet string
	// machine is the ELF machine of the architecture's binaries.
	machine elf.Machine
	// cc is the C compiler (cgo's CC).
	cc string
	// libDirs are where the libraries linked against are found on the
	// build machine, in the loader's order.
	libDirs []string
	// packages are the Debian packages that provide cc and the libraries.
	packages []string
}

// cArch is what Debian names for one architecture.
type cArch struct {
	triplet  string
	machine  elf.Machine
	crossGCC string // the cross compiler's package, e.g. gcc-aarch64-linux-gnu
	crossLib string // the cross libc's development package, e.g. libc6-dev-arm64-cross
}

// cArches are the architectures a cgo binary is built for (Debian's
// cross-toolchain packages, https://wiki.debian.org/CrossToolchains).
func cArches() map[string]cArch {
	return map[string]cArch{
		"amd64": {triplet: "x86_64-linux-gnu", machine: elf.EM_X86_64, crossGCC: "gcc-x86-64-linux-gnu", crossLib: "libc6-dev-amd64-cross"},
		"arm64": {triplet: "aarch64-linux-gnu", machine: elf.EM_AARCH64, crossGCC: "gcc-aarch64-linux-gnu", crossLib: "libc6-dev-arm64-cross"},
	}
}

// toolchainFor returns the C toolchain for linux/arch on a build machine
// of architecture host: the native one when they are the same, Debian's
// cross toolchain otherwise. It fails for an architecture without one.
func toolchainFor(arch, host string) (cToolchain, error) {
	a, ok := cArches()[arch]
	if !ok {
		return cToolchain{}, fmt.Errorf("no C toolchain is known for linux/%s (cgo binaries are built for linux/amd64 and linux/arm64)", arch)
	}
	if arch == host {
		return cToolchain{arch: arch, triplet: a.triplet, machine: a.machine, cc: "gcc",
			libDirs:  []string{"/lib/" + a.triplet, "/usr/lib/" + a.triplet},
			packages: []string{"gcc", "libc6-dev"}}, nil
	}
	return cToolchain{arch: arch, triplet: a.triplet, machine: a.machine, cc: a.triplet + "-gcc",
		libDirs:  []string{"/usr/" + a.triplet + "/lib"},
		packages: []string{a.crossGCC, a.crossLib}}, nil
}

// check fails, naming the Debian packages to install, when the compiler,
// glibc's development files (libc.so, the linker script) or glibc itself
// (libc.so.6) is missing.
func (tc cToolchain) check() error {
	var missing []string
	if _, err := exec.LookPath(tc.cc); err != nil {
		missing = append(missing, tc.cc)
	}
	for _, lib := range []string{"libc.so", "libc.so.6"} {
		if _, err := tc.find(lib); err != nil {
			missing = append(missing, lib+" in "+strings.Join(tc.libDirs, " or "))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("building the cgo binaries for linux/%s needs a C toolchain: %s missing; install it with `apt-get install %s` (hack/setup.sh --test installs them)",
			tc.arch, strings.Join(missing, ", "), strings.Join(tc.packages, " "))
	}
	return nil
}

// env is what `go build` needs to use the toolchain.
func (tc cToolchain) env() []string {
	return []string{"CGO_ENABLED=1", "CC=" + tc.cc}
}

// find returns the path of the library name in the toolchain's library
// directories.
func (tc cToolchain) find(name string) (string, error) {
	for _, d := range tc.libDirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not in %s", name, strings.Join(tc.libDirs, " or "))
}

// checkMachine fails unless bin is an ELF file for the toolchain's
// architecture.
func (tc cToolchain) checkMachine(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("reading %s as ELF: %w", bin, err)
	}
	defer f.Close()
	if f.Machine != tc.machine {
		return fmt.Errorf("%s is an ELF file for %s, not for linux/%s (%s): check CC", bin, f.Machine, tc.arch, tc.machine)
	}
	return nil
}

// runtimeFiles returns the files the dynamically linked binary bin needs
// at run time, at their paths in an image: its loader at its program
// interpreter path (ELF PT_INTERP) and every library it names (DT_NEEDED,
// transitively) in /lib/<triplet>, where the loader looks first; each
// from the toolchain's library directories, with its Debian package. A
// static binary needs none. It fails when bin is not an ELF file for the
// toolchain's architecture or a library is not found.
func (tc cToolchain) runtimeFiles(ctx context.Context, bin string) ([]imageFile, error) {
	if err := tc.checkMachine(bin); err != nil {
		return nil, err
	}
	interp, needed, err := elfDynamic(bin)
	if err != nil || interp == "" {
		return nil, err
	}
	loader, err := tc.find(path.Base(interp))
	if err != nil {
		return nil, fmt.Errorf("the loader of %s: %w", bin, err)
	}
	files := map[string]string{strings.TrimPrefix(interp, "/"): loader}
	seen := map[string]bool{path.Base(interp): true} // the loader satisfies its own soname
	for len(needed) > 0 {
		name := needed[0]
		needed = needed[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		src, err := tc.find(name)
		if err != nil {
			return nil, fmt.Errorf("a library %s needs: %w", bin, err)
		}
		if err := tc.checkMachine(src); err != nil {
			return nil, err
		}
		files[path.Join("lib", tc.triplet, name)] = src
		_, more, err := elfDynamic(src)
		if err != nil {
			return nil, err
		}
		needed = append(needed, more...)
	}
	out := make([]imageFile, 0, len(files))
	for name, src := range files {
		deb, err := debianPackage(ctx, src)
		if err != nil {
			return nil, err
		}
		out = append(out, imageFile{name: name, src: src, deb: deb})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// elfDynamic returns the program interpreter (PT_INTERP; "" for a static
// file) and the DT_NEEDED libraries of the ELF file p.
func elfDynamic(p string) (interp string, needed []string, err error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", nil, fmt.Errorf("reading %s as ELF: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		data := make([]byte, prog.Filesz)
		if _, err := prog.ReadAt(data, 0); err != nil {
			return "", nil, fmt.Errorf("reading the program interpreter of %s: %w", p, err)
		}
		interp = string(bytes.TrimRight(data, "\x00"))
	}
	needed, err = f.ImportedLibraries()
	if err != nil {
		return "", nil, fmt.Errorf("reading the libraries %s needs: %w", p, err)
	}
	return interp, needed, nil
}

// debPackage is the Debian package a file of an image comes from.
type debPackage struct {
	Name, Version, Arch string
}

// purl is the package's package URL (purl-spec's deb type).
func (d debPackage) purl() string {
	return "pkg:deb/debian/" + d.Name + "@" + d.Version + "?arch=" + d.Arch
}

// debianPackage asks dpkg which installed package holds the file p (at
// its path or, on a merged /usr, the path its symlinks resolve to), and
// that package's version and architecture.
func debianPackage(ctx context.Context, p string) (debPackage, error) {
	candidates := []string{p}
	if real, err := filepath.EvalSymlinks(p); err == nil && real != p {
		candidates = append(candidates, real)
	}
	var errs []error
	for _, c := range candidates {
		out, err := exec.CommandContext(ctx, "dpkg-query", "--search", c).Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("dpkg-query --search %s: %w", c, err))
			continue
		}
		// "libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6"; a diverted file
		// lists "diversion by …" lines first.
		for _, line := range strings.Split(string(out), "\n") {
			pkgs, file, ok := strings.Cut(line, ": ")
			if !ok || file != c || strings.HasPrefix(line, "diversion ") {
				continue
			}
			pkg, _, _ := strings.Cut(pkgs, ", ")
			info, err := exec.CommandContext(ctx, "dpkg-query", "--show", "--showformat", "${Package}\t${Version}\t${Architecture}", pkg).Output()
			if err != nil {
				return debPackage{}, fmt.Errorf("dpkg-query --show %s: %w", pkg, err)
			}
			f := strings.Split(string(info), "\t")
			if len(f) != 3 {
				return debPackage{}, fmt.Errorf("dpkg-query --show %s printed %q", pkg, info)
			}
			return debPackage{Name: f[0], Version: f[1], Arch: f[2]}, nil
		}
	}
	err := fmt.Errorf("%s belongs to no installed Debian package, which the image's SBOM must name (the build needs Debian's gcc and glibc packages)", p)
	if len(errs) > 0 {
		err = fmt.Errorf("%w: %w", err, errors.Join(errs...))
	}
	return debPackage{}, err
}
