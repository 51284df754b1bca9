package build

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// binary is a program baked into the image.
type binary struct {
	// Name is the program's name, e.g. kubelet.
	Name string `json:"name"`
	// Path is where it is in the image, e.g. /usr/local/bin/kubelet.
	Path string `json:"path"`
	// SHA256 is the hex digest of its content.
	SHA256 string `json:"sha256"`
	// Origin says where it came from and how it was checked.
	Origin string `json:"origin"`
	// LinkTo, when set, makes Path a symbolic link to this name in the
	// same directory (the components of a multi-call binary).
	LinkTo string `json:"linkTo,omitempty"`
	// source is the file on this machine.
	source string
}

// kubeComponents are the pinned Kubernetes binaries of a node; kubeBinDir
// is where the bootstrapper finds kubeadm (its --kubeadm default).
func kubeComponents() []string { return []string{"kubelet", "kubeadm", "kubectl"} }

const kubeBinDir = "/usr/local/bin"

// kubeBinaries checks the pinned kubelet, kubeadm and kubectl in dir and
// returns what to bake in. A binary whose digest is the official one in
// internal/versions (kubernetes-components.yaml) is taken as that; one
// built from source (hack/kube-binaries.sh: a multi-call binary "kube"
// with a symbolic link per component) has no official digest and must
// report the pinned version. Several names of one file are baked in as
// that file once, with symbolic links.
func kubeBinaries(ctx context.Context, dir string) ([]binary, error) {
	release := versions.Default()
	official, err := release.Components("amd64")
	if err != nil {
		return nil, err
	}
	want := map[string]string{}
	for _, c := range official {
		want[c.Name] = strings.TrimPrefix(c.Hash, "sha256:")
	}
	var out []binary
	files := map[string]bool{} // real files already baked in
	for _, name := range kubeComponents() {
		real, err := filepath.EvalSymlinks(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("%s is missing in %s: run hack/kube-binaries.sh (make image does): %w", name, dir, err)
		}
		sum, err := sha256File(real)
		if err != nil {
			return nil, err
		}
		b := binary{Name: name, Path: kubeBinDir + "/" + name, SHA256: sum, source: real}
		if sum == want[name] {
			b.Origin = fmt.Sprintf("Kubernetes %s release binary (linux/amd64), sha256 as in internal/versions/kubernetes-components.yaml", release.Version)
		} else {
			if err := checkKubeVersion(ctx, filepath.Join(dir, name), release.Version); err != nil {
				return nil, err
			}
			b.Origin = fmt.Sprintf("Kubernetes %s built from source (hack/kube-binaries.sh): its version checked; the official release digest %s does not apply", release.Version, short(want[name]))
		}
		if base := filepath.Base(real); base != name {
			if !files[real] {
				files[real] = true
				out = append(out, binary{Name: base, Path: kubeBinDir + "/" + base, SHA256: sum, source: real,
					Origin: "multi-call binary of " + strings.Join(kubeComponents(), ", ") + ": " + b.Origin})
			}
			b.LinkTo, b.source = base, ""
		}
		out = append(out, b)
	}
	return out, nil
}

// checkKubeVersion runs the component at path and checks that it is of
// version (e.g. v1.36.4).
func checkKubeVersion(ctx context.Context, path, version string) error {
	args := map[string][]string{
		"kubelet": {"--version"},
		"kubeadm": {"version", "-o", "short"},
		"kubectl": {"version", "--client"},
	}[filepath.Base(path)]
	out, err := run(ctx, command{}, path, args...)
	if err != nil {
		return fmt.Errorf("checking the version of %s: %w", path, err)
	}
	if !strings.Contains(string(out), version) {
		return fmt.Errorf("%s is not the pinned Kubernetes %s: it says %q; run hack/kube-binaries.sh for the pinned binaries", path, version, strings.TrimSpace(string(out)))
	}
	return nil
}

// bootstrapperPath is where the image has the bootstrapper.
const bootstrapperPath = "/usr/bin/gatehouse-bootstrapper"

// builtBinary is a binary that may live in a temporary directory until
// cleanup.
type builtBinary struct {
	binary
	cleanup func()
}

// bootstrapperBinary returns opts.Bootstrapper, or builds the bootstrapper
// from opts.Source with go build -trimpath -buildvcs=false, stripped of
// its symbol table and DWARF (-s -w: a smaller image and a faster link;
// panics still name functions): without the commit stamped in, its digest
// (a cache key) changes only when its code does; the manifest names the
// commit. It needs cgo (the key service's
// PKCS#11 library is in its import graph), so it links the host's glibc
// dynamically: build on Debian 12, the image's release.
func bootstrapperBinary(ctx context.Context, p *progress, opts Options) (*builtBinary, error) {
	b := &builtBinary{binary: binary{Name: "gatehouse-bootstrapper", Path: bootstrapperPath}, cleanup: func() {}}
	if opts.Bootstrapper != "" {
		b.source, b.Origin = opts.Bootstrapper, "given with --bootstrapper ("+opts.Bootstrapper+")"
	} else {
		tmp, err := os.MkdirTemp("", "gatehouse-image-")
		if err != nil {
			return nil, err
		}
		b.cleanup = func() { _ = os.RemoveAll(tmp) }
		b.source = filepath.Join(tmp, "gatehouse-bootstrapper")
		if err := p.step("Building gatehouse-bootstrapper from "+opts.Source, func() error {
			_, err := run(ctx, command{dir: opts.Source}, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", b.source, "./cmd/gatehouse-bootstrapper")
			return err
		}); err != nil {
			b.cleanup()
			return nil, err
		}
		b.Origin = "built from " + describeSource(ctx, opts.Source) + ", " + goVersion(b.source) + ", with go build -trimpath -buildvcs=false -ldflags=\"-s -w\" (cgo, glibc of the build machine)"
	}
	var err error
	if b.SHA256, err = sha256File(b.source); err != nil {
		b.cleanup()
		return nil, err
	}
	return b, nil
}

// describeSource names the Gatehouse commit in dir (git), with a note when
// the work tree has changes; just ./cmd/gatehouse-bootstrapper where git
// cannot tell.
func describeSource(ctx context.Context, dir string) string {
	const pkg = "./cmd/gatehouse-bootstrapper"
	rev, err := run(ctx, command{dir: dir}, "git", "rev-parse", "HEAD")
	if err != nil {
		return pkg
	}
	s := pkg + " at commit " + strings.TrimSpace(string(rev))
	if status, err := run(ctx, command{dir: dir}, "git", "status", "--porcelain", "--untracked-files=no"); err == nil && len(status) > 0 {
		s += " with uncommitted changes"
	}
	return s
}

// goVersion names the toolchain that built the Go binary at path.
func goVersion(path string) string {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return "Go toolchain unknown"
	}
	return info.GoVersion
}
