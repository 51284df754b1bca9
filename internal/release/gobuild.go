package release

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
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
// is built with CGO_ENABLED=1 and a C toolchain (cToolchain) for each
// architecture.
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

// build compiles c for linux/arch into out, with cgo through tc when tc
// is not nil (needsCgo), without otherwise. images are
// name=repository@digest pairs compiled into internal/buildinfo (the
// CLI's).
func (g goBuilder) build(ctx context.Context, c Command, arch string, tc *cToolchain, out string, images []string) error {
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
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=0", "GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=", "GOEXPERIMENT=")
	if tc != nil {
		cmd.Env = append(cmd.Env, tc.env()...) // later entries win
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for linux/%s: %w: %s", c.Package, arch, err, stderr.String())
	}
	if tc != nil {
		return tc.checkMachine(out)
	}
	return nil
}
