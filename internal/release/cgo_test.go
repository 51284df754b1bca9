package release

import (
	"context"
	"debug/elf"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestToolchainFor(t *testing.T) {
	tests := []struct {
		name, arch, host string
		want             cToolchain
		wantErr          string
	}{
		{name: "native amd64", arch: "amd64", host: "amd64", want: cToolchain{arch: "amd64", triplet: "x86_64-linux-gnu", machine: elf.EM_X86_64,
			cc: "gcc", libDirs: []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}, packages: []string{"gcc", "libc6-dev"}}},
		{name: "arm64 on amd64: Debian's cross toolchain", arch: "arm64", host: "amd64", want: cToolchain{arch: "arm64", triplet: "aarch64-linux-gnu", machine: elf.EM_AARCH64,
			cc: "aarch64-linux-gnu-gcc", libDirs: []string{"/usr/aarch64-linux-gnu/lib"}, packages: []string{"gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"}}},
		{name: "amd64 on arm64", arch: "amd64", host: "arm64", want: cToolchain{arch: "amd64", triplet: "x86_64-linux-gnu", machine: elf.EM_X86_64,
			cc: "x86_64-linux-gnu-gcc", libDirs: []string{"/usr/x86_64-linux-gnu/lib"}, packages: []string{"gcc-x86-64-linux-gnu", "libc6-dev-amd64-cross"}}},
		{name: "unknown architecture", arch: "riscv64", host: "amd64", wantErr: "no C toolchain is known for linux/riscv64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := toolchainFor(tt.arch, tt.host)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("toolchainFor = %+v, %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.arch != tt.want.arch || got.triplet != tt.want.triplet || got.machine != tt.want.machine || got.cc != tt.want.cc ||
				!slices.Equal(got.libDirs, tt.want.libDirs) || !slices.Equal(got.packages, tt.want.packages) {
				t.Errorf("toolchainFor = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// requireToolchain returns the C toolchain for linux/arch here, skipping
// (failing in CI) when it is not installed.
func requireToolchain(t *testing.T, arch string) cToolchain {
	t.Helper()
	tc, err := toolchainFor(arch, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	if err := tc.check(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return tc
}

// The files a dynamically linked C program needs are its loader at its
// PT_INTERP path and its libraries, transitively, in /lib/<triplet>, from
// the toolchain's library directories, each with its Debian package.
func TestRuntimeFiles(t *testing.T) {
	src := filepath.Join(t.TempDir(), "m.c")
	if err := os.WriteFile(src, []byte("#include <math.h>\n#include <stdio.h>\nint main(int c, char **v) { printf(\"%f\\n\", cos(c)); return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for arch := range cArches() {
		t.Run(arch, func(t *testing.T) {
			tc := requireToolchain(t, arch)
			bin := filepath.Join(t.TempDir(), "m")
			if out, err := exec.Command(tc.cc, "-o", bin, src, "-lm").CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", tc.cc, err, out)
			}
			files, err := tc.runtimeFiles(context.Background(), bin)
			if err != nil {
				t.Fatal(err)
			}
			interp, _, err := elfDynamic(bin)
			if err != nil || interp == "" {
				t.Fatalf("%s has no loader: %v", bin, err)
			}
			want := []string{interp[1:], "lib/" + tc.triplet + "/libc.so.6", "lib/" + tc.triplet + "/libm.so.6"}
			slices.Sort(want)
			var names []string
			for _, f := range files {
				names = append(names, f.name)
				if err := tc.checkMachine(f.src); err != nil {
					t.Error(err)
				}
				wantPkg := "libc6"
				if arch != runtime.GOARCH {
					wantPkg = "libc6-" + arch + "-cross"
				}
				if f.deb.Name != wantPkg || f.deb.Version == "" || f.deb.Arch == "" {
					t.Errorf("%s (from %s) comes from Debian package %+v, want %s", f.name, f.src, f.deb, wantPkg)
				}
			}
			if !slices.Equal(names, want) {
				t.Errorf("runtime files %v, want %v", names, want)
			}
		})
	}
}

func TestRuntimeFilesRefused(t *testing.T) {
	tc := requireToolchain(t, runtime.GOARCH)
	src := filepath.Join(t.TempDir(), "s.c")
	if err := os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	static := filepath.Join(t.TempDir(), "s")
	if out, err := exec.Command(tc.cc, "-static", "-o", static, src).CombinedOutput(); err != nil {
		t.Fatalf("%s -static: %v: %s", tc.cc, err, out)
	}
	files, err := tc.runtimeFiles(context.Background(), static)
	if err != nil || len(files) != 0 {
		t.Errorf("runtime files of a static program: %v, %v; want none", files, err)
	}
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	otc, err := toolchainFor(other, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	// A library directory without the loader or a library.
	empty := tc
	empty.libDirs = []string{t.TempDir()}
	notPackaged := filepath.Join(t.TempDir(), "libx.so")
	if err := os.WriteFile(notPackaged, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		run     func() error
		wantErr string
	}{
		{name: "binary of another architecture", run: func() error { _, err := otc.runtimeFiles(context.Background(), static); return err },
			wantErr: "not for linux/" + other},
		{name: "not ELF", run: func() error { _, err := tc.runtimeFiles(context.Background(), src); return err }, wantErr: "reading " + src + " as ELF"},
		{name: "loader missing", run: func() error { _, err := empty.runtimeFiles(context.Background(), "/bin/sh"); return err },
			wantErr: "is not in " + empty.libDirs[0]},
		{name: "file of no Debian package", run: func() error { _, err := debianPackage(context.Background(), notPackaged); return err },
			wantErr: notPackaged + " belongs to no installed Debian package"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.run(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want one with %q", err, tt.wantErr)
			}
		})
	}
}

func TestToolchainCheckNamesPackages(t *testing.T) {
	for arch := range cArches() {
		tc, err := toolchainFor(arch, "s390x") // a cross toolchain for every architecture
		if err != nil {
			t.Fatal(err)
		}
		tc.cc = "no-such-gcc"
		tc.libDirs = []string{t.TempDir()}
		err = tc.check()
		want := "apt-get install " + strings.Join(tc.packages, " ")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "no-such-gcc") {
			t.Errorf("check() = %v, want an error naming the compiler and %q", err, want)
		}
	}
}

// A release whose cgo binaries have no C toolchain fails before anything
// is built, naming the Debian packages to install; it omits nothing.
func TestBuildWithoutCToolchain(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() // only go: no gcc, no cross gcc
	if err := os.Symlink(gobin, filepath.Join(path, "go")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", path)
	signer, _ := keys(t)
	out := filepath.Join(t.TempDir(), "release")
	_, err = Build(context.Background(), Config{
		Version: "v0.1.0", Commit: "0123456789abcdef0123456789abcdef01234567", RepoDir: "../..", OutDir: out,
		Registry: "ghcr.io/gatehouse-dev", Arches: DefaultArches(),
		Commands: []Command{{Name: "gatehouse-pause", Package: "./cmd/gatehouse-pause"}, {Name: "gatehouse-keyservice", Package: "./cmd/gatehouse-keyservice"}},
		Images:   []ImageSpec{{Name: "gatehouse-keyservice", Command: "gatehouse-keyservice"}},
		Signer:   signer, Epoch: time.Unix(1700000000, 0).UTC(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	var wants []string
	for _, arch := range DefaultArches() {
		tc, err := toolchainFor(arch, runtime.GOARCH)
		if err != nil {
			t.Fatal(err)
		}
		wants = append(wants, "linux/"+arch+" needs a C toolchain", "apt-get install "+strings.Join(tc.packages, " "))
	}
	for _, want := range append(wants, "gatehouse-keyservice use cgo (", "github.com/miekg/pkcs11") {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Build = %v, want an error with %q", err, want)
		}
	}
	entries, _ := os.ReadDir(out)
	if len(entries) != 0 {
		t.Errorf("the failed release left %d entries in %s, want none", len(entries), out)
	}
}
