package release

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
)

// buildinfoPackage is where the linker sets the version, commit and image
// digests (internal/buildinfo).
const buildinfoPackage = "github.com/gatehouse-dev/gatehouse/internal/buildinfo"

// Command is a Go main package to build: its binary's name and package
// path (e.g. ./cmd/gatehouse-joinservice).
type Command struct {
	Name    string
	Package string
}

// goBuilder runs `go build` in the module at dir with the release's
// flags: -trimpath, no VCS stamping and no build ID (the commit comes
// through -X instead), stripped, fixed GOAMD64/GOARM64 levels.
type goBuilder struct {
	dir     string
	version string
	commit  string
}

// needsCgo reports the packages outside the standard library that pkg
// builds with cgo (e.g. github.com/miekg/pkcs11): a binary that has one
// is built with CGO_ENABLED=1, and only for the host's architecture.
func (g goBuilder) needsCgo(ctx context.Context, pkg string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-f", "{{if and (not .Standard) .CgoFiles}}{{.ImportPath}}{{end}}", pkg)
	cmd.Dir = g.dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOOS=linux")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w: %s", pkg, err, stderr.String())
	}
	return strings.Fields(string(out)), nil
}

// build compiles c for linux/arch into out. images are name=repository@digest
// pairs compiled into internal/buildinfo (the CLI's). It returns the
// reason when c cannot be built for arch here (cgo across architectures).
func (g goBuilder) build(ctx context.Context, c Command, arch, out string, images []string) (omitted string, err error) {
	cgoPkgs, err := g.needsCgo(ctx, c.Package)
	if err != nil {
		return "", err
	}
	cgo := "0"
	if len(cgoPkgs) > 0 {
		if arch != runtime.GOARCH {
			return fmt.Sprintf("needs cgo (%s) and a C toolchain for linux/%s, which this builder does not use: build it on a linux/%s machine (docs/install.md, \"Platforms\")",
				strings.Join(cgoPkgs, ", "), arch, arch), nil
		}
		cgo = "1"
	}
	ldflags := []string{"-s", "-w", "-buildid=",
		"-X", buildinfoPackage + ".version=" + g.version,
		"-X", buildinfoPackage + ".commit=" + g.commit}
	if len(images) > 0 {
		sorted := append([]string(nil), images...)
		sort.Strings(sorted)
		ldflags = append(ldflags, "-X", buildinfoPackage+".images="+strings.Join(sorted, ","))
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", strings.Join(ldflags, " "), "-o", out, c.Package)
	cmd.Dir = g.dir
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED="+cgo, "GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=", "GOEXPERIMENT=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s for linux/%s: %w: %s", c.Package, arch, err, stderr.String())
	}
	return "", nil
}
