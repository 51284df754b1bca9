package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// isolatedDirs are overlaid in RunIsolated: kubeadm writes under
// /etc/kubernetes and /var/lib/kubelet even with --dry-run.
var isolatedDirs = []string{"/etc", "/var/lib"}

// isolateScript mounts an overlay over each directory given in $GATEHOUSE_ISOLATED
// (space separated) whose upper layer is under $GATEHOUSE_SCRATCH, then runs
// the command. It runs inside a private mount namespace made by unshare(1).
const isolateScript = `set -eu
for d in $GATEHOUSE_ISOLATED; do
	n=$(printf %s "$d" | tr / _)
	mkdir -p "$GATEHOUSE_SCRATCH/$n/upper" "$GATEHOUSE_SCRATCH/$n/work"
	mount -t overlay overlay -o "lowerdir=$d,upperdir=$GATEHOUSE_SCRATCH/$n/upper,workdir=$GATEHOUSE_SCRATCH/$n/work" "$d"
done
exec "$@"`

// RunIsolated runs bin with args in a private mount namespace in which /etc
// and /var/lib are overlays: the command sees the host's files, but whatever
// it writes there lands in scratch (scratch/_etc/upper, scratch/_var_lib/upper)
// and the host's /etc/kubernetes and /var/lib/kubelet stay untouched. This is
// how tests run `kubeadm ... --dry-run`, which writes under /etc/kubernetes
// anyway. It needs root (unshare(1), mount(8)); it returns the combined output.
func RunIsolated(ctx context.Context, scratch, bin string, args ...string) ([]byte, error) {
	if strings.ContainsAny(scratch, ",:") {
		// They separate overlay mount options and lower directories.
		return nil, fmt.Errorf("scratch directory %q contains ',' or ':', which overlay mounts cannot take", scratch)
	}
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return nil, fmt.Errorf("creating scratch directory: %w", err)
	}
	unshareArgs := append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", isolateScript, "sh", bin}, args...)
	cmd := exec.CommandContext(ctx, "unshare", unshareArgs...)
	cmd.Env = append(os.Environ(),
		"GATEHOUSE_SCRATCH="+scratch,
		"GATEHOUSE_ISOLATED="+strings.Join(isolatedDirs, " "),
		// kubeadm runs `kubelet --version` and friends from PATH.
		"PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("running %s isolated: %w", filepath.Base(bin), err)
	}
	return out, nil
}

// RequireRoot stops the test unless it runs as root. Under CI (CI set) it
// fails the test, so nothing that CI is meant to run is skipped silently.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("this test needs root (mount namespaces); CI must run as root")
	}
	t.Skip("needs root (mount namespaces): run `make test` as root")
}
