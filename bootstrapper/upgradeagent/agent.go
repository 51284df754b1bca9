// Package upgradeagent is a node's upgrade agent (`gatehouse-bootstrapper
// serve-upgrade`): it moves the node to a new Kubernetes release in
// kubeadm's order when an administrator's `gatehouse upgrade apply
// --kubernetes` asks it to, one node at a time (docs/upgrades.md). It
// serves api/upgradeagent/v1 behind atls.ClientCertDoor: administrators
// only.
package upgradeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	upgradeagentv1 "github.com/gatehouse-dev/gatehouse/api/upgradeagent/v1"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// Defaults of Options.
const (
	// defaultKubeletTimeout is how long the restarted kubelet may take to
	// answer its health check when the request names no time.
	defaultKubeletTimeout = 2 * time.Minute
	// defaultKubeadmTimeout bounds one kubeadm upgrade: kubeadm itself
	// waits up to 5 minutes for each static pod it replaces.
	defaultKubeadmTimeout = 20 * time.Minute
	// kubeletHealthzURL is the kubelet's health endpoint on the node
	// (KubeletConfiguration healthzBindAddress and healthzPort defaults).
	kubeletHealthzURL = "http://127.0.0.1:10248/healthz"
)

// componentNames are the only files an upgrade installs.
var componentNames = []string{"kubeadm", "kubelet", "kubectl"}

// installer installs sha256-checked components; *installer.Installer.
type installer interface {
	Install(ctx context.Context, components []*componentsv1.Component) error
}

// kubeadmRunner runs the node's kubeadm; bootstrapper.ExecKubeadm.
type kubeadmRunner interface {
	Run(ctx context.Context, args ...string) ([]byte, error)
}

// kubeletService restarts the node's kubelet; bootstrapper.KubeletService.
type kubeletService interface {
	Restart(ctx context.Context) error
}

// Options configure a Server. Installer, Kubeadm and Kubelet are
// required.
type Options struct {
	Installer installer
	Kubeadm   kubeadmRunner
	Kubelet   kubeletService
	// InstallDir is where kubeadm, kubelet and kubectl are installed
	// ("/usr/local/bin"): a request naming another path is refused.
	InstallDir string
	// KubeletHealthy returns nil once the kubelet answers its health
	// check; nil checks kubeletHealthzURL.
	KubeletHealthy func(ctx context.Context) error
	// IgnorePreflightErrors are passed to kubeadm upgrade, as the
	// bootstrapper passes its own to kubeadm init and join.
	IgnorePreflightErrors []string
	// PatchesDir is the node's kubeadm patches directory
	// (bootstrapper.KubeadmPatchesDir), passed to kubeadm upgrade with
	// --patches when it exists: kubeadm writes the kubelet's
	// configuration from the cluster's, and the node's own settings (its
	// cgroup root, for one) must go over it again, as at join.
	PatchesDir string
	// KubeadmTimeout bounds the kubeadm stage (defaultKubeadmTimeout).
	KubeadmTimeout time.Duration
	Log            *slog.Logger
}

// Server is the UpgradeAgentService. One upgrade runs at a time; it runs
// to its end even when its caller goes away (a kubeadm killed half-way
// would leave the node between versions), and a caller that comes back
// asks again.
type Server struct {
	upgradeagentv1.UnimplementedUpgradeAgentServiceServer
	opts    Options
	running sync.Mutex
}

// New returns the agent.
func New(opts Options) (*Server, error) {
	if opts.Installer == nil || opts.Kubeadm == nil || opts.Kubelet == nil {
		return nil, errors.New("upgrade agent: an installer, kubeadm and a kubelet service are required")
	}
	if !filepath.IsAbs(opts.InstallDir) {
		return nil, fmt.Errorf("upgrade agent: install directory %q is not absolute", opts.InstallDir)
	}
	if opts.KubeletHealthy == nil {
		client := &http.Client{Timeout: 2 * time.Second}
		opts.KubeletHealthy = func(ctx context.Context) error { return httpHealthy(ctx, client, kubeletHealthzURL) }
	}
	if opts.KubeadmTimeout == 0 {
		opts.KubeadmTimeout = defaultKubeadmTimeout
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{opts: opts}, nil
}

// plan is a checked request.
type plan struct {
	release        versions.Release
	kubeadm, other []*componentsv1.Component
	args           []string
	kubeletTimeout time.Duration
}

// check validates a request without changing anything: a supported
// release, a known step, exactly the three components under InstallDir.
func (s *Server) check(req *upgradeagentv1.UpgradeRequest) (*plan, error) {
	release, err := versions.Resolve(req.GetKubernetesVersion())
	if err != nil {
		return nil, err
	}
	if release.Version != req.GetKubernetesVersion() {
		return nil, fmt.Errorf("kubernetes version %q: name the exact release (%s)", req.GetKubernetesVersion(), release.Version)
	}
	p := &plan{release: release, kubeletTimeout: time.Duration(req.GetKubeletTimeoutSeconds()) * time.Second}
	if p.kubeletTimeout == 0 {
		p.kubeletTimeout = defaultKubeletTimeout
	}
	switch req.GetStep() {
	case upgradeagentv1.Step_STEP_APPLY:
		p.args = []string{"upgrade", "apply", release.Version, "--yes"}
	case upgradeagentv1.Step_STEP_NODE:
		p.args = []string{"upgrade", "node"}
	case upgradeagentv1.Step_STEP_KUBELET:
	default:
		return nil, fmt.Errorf("step %s: ask for APPLY (the first control plane), NODE or KUBELET", req.GetStep())
	}
	if len(p.args) > 0 && len(s.opts.IgnorePreflightErrors) > 0 {
		p.args = append(p.args, "--ignore-preflight-errors="+strings.Join(s.opts.IgnorePreflightErrors, ","))
	}
	if len(p.args) > 0 && s.opts.PatchesDir != "" {
		if _, err := os.Stat(s.opts.PatchesDir); err == nil {
			p.args = append(p.args, "--patches="+s.opts.PatchesDir)
		}
	}
	seen := map[string]bool{}
	for _, c := range req.GetComponents() {
		name := filepath.Base(c.GetInstallPath())
		if c.GetInstallPath() != filepath.Join(s.opts.InstallDir, name) || !slices.Contains(componentNames, name) || c.GetExtract() {
			return nil, fmt.Errorf("component %q: this node installs only %s, each a file in %s", c.GetInstallPath(), strings.Join(componentNames, ", "), s.opts.InstallDir)
		}
		if seen[name] {
			return nil, fmt.Errorf("component %s named twice", name)
		}
		seen[name] = true
		if name == "kubeadm" {
			p.kubeadm = append(p.kubeadm, c)
		} else {
			p.other = append(p.other, c)
		}
	}
	if len(seen) != len(componentNames) {
		return nil, fmt.Errorf("the request names %d of the components %s: name all of them", len(seen), strings.Join(componentNames, ", "))
	}
	return p, nil
}

// Upgrade implements UpgradeAgentService.Upgrade.
func (s *Server) Upgrade(req *upgradeagentv1.UpgradeRequest, stream upgradeagentv1.UpgradeAgentService_UpgradeServer) error {
	p, err := s.check(req)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if !s.running.TryLock() {
		return status.Error(codes.Aborted, "another upgrade is running on this node: ask again once it ended")
	}
	defer s.running.Unlock()
	// The node finishes what it started even if its caller goes.
	ctx := context.WithoutCancel(stream.Context())
	send := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		s.opts.Log.Info(msg)
		_ = stream.Send(&upgradeagentv1.UpgradeResponse{Message: msg}) // a caller gone does not stop the node
	}
	log := s.opts.Log.With("version", p.release.Version, "step", req.GetStep().String())
	log.Info("Upgrade step asked for")

	out, err := s.opts.Kubeadm.Run(ctx, "version", "-o", "short")
	if err != nil {
		return status.Errorf(codes.Internal, "reading the installed kubeadm's version: %v: %s", err, tail(out))
	}
	current := strings.TrimSpace(string(out))
	if req.GetStep() == upgradeagentv1.Step_STEP_KUBELET {
		if current != p.release.Version {
			return status.Errorf(codes.FailedPrecondition, "this node's kubeadm is %s: the kubelet moves to %s only after kubeadm upgrade ran with kubeadm %s (step APPLY or NODE first)", current, p.release.Version, p.release.Version)
		}
		if err := s.kubelet(ctx, p, send); err != nil {
			return err
		}
		log.Info("Kubelet step done")
		return nil
	}
	if err := versions.CheckUpgrade(current, p.release); err != nil {
		return status.Errorf(codes.FailedPrecondition, "this node's kubeadm is %s: %v", current, err)
	}
	if err := s.opts.Installer.Install(ctx, p.kubeadm); err != nil {
		return status.Errorf(codes.Internal, "installing kubeadm %s: %v", p.release.Version, err)
	}
	send("kubeadm %s installed (sha256 checked); running kubeadm %s", p.release.Version, strings.Join(p.args[:2], " "))
	kctx, cancel := context.WithTimeout(ctx, s.opts.KubeadmTimeout)
	out, err = s.opts.Kubeadm.Run(kctx, p.args...)
	cancel()
	if err != nil {
		return status.Errorf(codes.Internal, "kubeadm %s: %v; its last lines:\n%s", strings.Join(p.args[:2], " "), err, tail(out))
	}
	send("kubeadm %s done", strings.Join(p.args[:2], " "))
	log.Info("Kubeadm step done")
	return nil
}

// kubelet installs the kubelet and kubectl, restarts the kubelet and
// waits for its health check.
func (s *Server) kubelet(ctx context.Context, p *plan, send func(string, ...any)) error {
	if err := s.opts.Installer.Install(ctx, p.other); err != nil {
		return status.Errorf(codes.Internal, "installing the kubelet and kubectl %s: %v", p.release.Version, err)
	}
	if err := s.opts.Kubelet.Restart(ctx); err != nil {
		return status.Errorf(codes.Internal, "restarting the kubelet: %v", err)
	}
	send("kubelet %s installed (sha256 checked) and restarted; waiting up to %s for its health check", p.release.Version, p.kubeletTimeout)
	if err := waitHealthy(ctx, s.opts.KubeletHealthy, p.kubeletTimeout); err != nil {
		return status.Errorf(codes.Internal, "the kubelet %s did not become healthy within %s after its restart: %v (its log on the node: journalctl -u kubelet)", p.release.Version, p.kubeletTimeout, err)
	}
	send("kubelet %s healthy", p.release.Version)
	return nil
}

// waitHealthy polls healthy every half second until it returns nil or
// timeout passes; the error is healthy's last.
func waitHealthy(ctx context.Context, healthy func(context.Context) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		err := healthy(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

// httpHealthy returns nil when url answers 200.
func httpHealthy(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return nil
}

// tail is the last 20 lines of a command's output.
func tail(out []byte) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}
