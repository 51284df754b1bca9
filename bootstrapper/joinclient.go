package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"path"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/logtail"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/joincreds"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// Backoff is the retry schedule for calls to the join service.
type Backoff struct {
	// Initial is the first wait; each next doubles, up to Max; every wait is
	// drawn uniformly from [wait/2, wait) (jitter).
	Initial, Max time.Duration
}

// DefaultBackoff waits 1 s, 2 s, … up to 1 min between rounds.
var DefaultBackoff = Backoff{Initial: time.Second, Max: time.Minute}

// wait sleeps for the attempt-th wait, until ctx ends (its error) or
// until stop is closed (nodelock.ErrLocked).
func (b Backoff) wait(ctx context.Context, attempt int, stop <-chan struct{}) error {
	d := b.Initial << min(attempt, 30)
	if d <= 0 || d > b.Max {
		d = b.Max
	}
	d = d/2 + rand.N(d/2+1) //nolint:gosec // jitter, not a secret
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return nodelock.ErrLocked
	case <-t.C:
		return nil
	}
}

// JoinConfig holds a JoinClient's dependencies.
type JoinConfig struct {
	Setup *Setup
	Lock  *nodelock.Lock
	// Endpoints finds the join service.
	Endpoints EndpointSource
	// Attester produces this node's evidence.
	Attester attestation.Attester
	// CACertHash is the cluster identity the node was provisioned with:
	// the discovery token CA cert hash the join service must chain to.
	CACertHash string
	// ControlPlane asks to join as a control plane.
	ControlPlane bool
	// Backoff between rounds over all endpoints; zero is DefaultBackoff.
	Backoff Backoff
	// KubeadmAttempts bounds kubeadm join runs; 0 is 3.
	KubeadmAttempts int
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// JoinClient joins this node to an existing cluster through the join
// service.
type JoinClient struct {
	cfg JoinConfig
}

// FailedError is a failure after the node lock: the node cannot go back
// and must be reset (its state disk is marked for reset).
type FailedError struct{ Err error }

func (e *FailedError) Error() string {
	return "bootstrap failed after the node lock; the node must be reset (rebooted with a fresh state disk): " + e.Err.Error()
}
func (e *FailedError) Unwrap() error { return e.Err }

// NewJoinClient returns a JoinClient.
func NewJoinClient(cfg JoinConfig) (*JoinClient, error) {
	if cfg.Setup == nil || cfg.Lock == nil || cfg.Endpoints == nil || cfg.Attester == nil {
		return nil, errors.New("join client: Setup, Lock, Endpoints and Attester are required")
	}
	if cfg.Backoff == (Backoff{}) {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.KubeadmAttempts <= 0 {
		cfg.KubeadmAttempts = 3
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if _, err := joincreds.Client(cfg.Attester, cfg.CACertHash, cfg.Now); err != nil {
		return nil, fmt.Errorf("join client: %w", err)
	}
	return &JoinClient{cfg: cfg}, nil
}

// Join gets a join ticket, retrying with backoff until ctx ends or the
// lock is taken by someone else (nodelock.ErrLocked), then takes the node
// lock and joins. Errors after the lock are *FailedError.
func (c *JoinClient) Join(ctx context.Context) error {
	setup := c.cfg.Setup
	diskUUID, err := setup.Disk.UUID(ctx)
	if err != nil {
		return err
	}
	ip := net.ParseIP(setup.Node.AdvertiseAddress)
	csr, kubeletKey, err := clusterpki.NewKubeletCSR(setup.Node.Name, []net.IP{ip})
	if err != nil {
		return err
	}
	req := &joinservicev1.IssueJoinTicketRequest{DiskUuid: diskUUID, CertificateRequest: csr, IsControlPlane: c.cfg.ControlPlane}
	var ticket *joinservicev1.IssueJoinTicketResponse
	err = c.retry(ctx, "join ticket", func(ctx context.Context, client joinservicev1.JoinServiceClient) error {
		var err error
		ticket, err = client.IssueJoinTicket(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	id, err := keys.DeriveClusterID(ticket.GetMeasurementSecret(), ticket.GetMeasurementSalt())
	if err != nil {
		return err
	}
	if err := c.cfg.Lock.TryLock("join", id); err != nil {
		return err
	}
	_ = writeStatus(setup.Root, PhaseJoining, nil, c.cfg.Now())
	if err := c.setUp(ctx, ticket, kubeletKey); err != nil {
		return c.fail(err)
	}
	_ = writeStatus(setup.Root, PhaseDone, nil, c.cfg.Now())
	setup.Log.Info("Joined the cluster", "controlPlane", c.cfg.ControlPlane)
	return nil
}

// fail marks the node failed after the lock.
func (c *JoinClient) fail(err error) error { return c.cfg.Setup.markFailed(err, c.cfg.Now()) }

// retry calls call on each endpoint in turn, round after round with
// backoff, until one succeeds. It gives up on ctx's end, when the lock is
// taken, and on answers that retrying cannot change (PermissionDenied,
// InvalidArgument, FailedPrecondition).
func (c *JoinClient) retry(ctx context.Context, what string, call func(context.Context, joinservicev1.JoinServiceClient) error) error {
	log := c.cfg.Setup.Log
	for round := 0; ; round++ {
		if c.cfg.Lock.Locked() {
			return nodelock.ErrLocked
		}
		endpoints, err := c.cfg.Endpoints.Endpoints(ctx)
		if err != nil {
			log.Warn("No join service endpoints yet", "error", err.Error())
		}
		for _, ep := range endpoints {
			err := c.callOne(ctx, ep, call)
			if err == nil {
				return nil
			}
			switch status.Code(err) {
			case codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition:
				return fmt.Errorf("the join service at %s refused the %s request: %w", ep, what, err)
			}
			if rejectedEvidence(err) {
				log.Error("The join service refused this node's attestation evidence; its audit log names the reason "+
					"(e.g. measurement_mismatch). Retrying in case its policy changes.", "endpoint", ep, "request", what, "round", round)
				continue
			}
			log.Warn("Join service call failed; trying the next endpoint", "endpoint", ep, "request", what, "round", round, "error", err.Error())
		}
		if err := c.cfg.Backoff.wait(ctx, round, c.cfg.Lock.Taken()); err != nil {
			return err
		}
	}
}

// rejectedEvidence reports whether err is the join service refusing this
// node's attested TLS certificate (TLS alert bad_certificate, RFC 8446
// §6.2): the service does not tell a refused client why.
func rejectedEvidence(err error) bool {
	return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "tls: bad certificate")
}

func (c *JoinClient) callOne(ctx context.Context, endpoint string, call func(context.Context, joinservicev1.JoinServiceClient) error) error {
	creds, err := joincreds.Client(c.cfg.Attester, c.cfg.CACertHash, c.cfg.Now)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return call(ctx, joinservicev1.NewJoinServiceClient(conn))
}

// setUp does what follows the lock: re-key, install, files, kubeadm join.
func (c *JoinClient) setUp(ctx context.Context, t *joinservicev1.IssueJoinTicketResponse, kubeletKey []byte) error {
	setup := c.cfg.Setup
	setup.Log.Info("Re-keying the state disk with the join ticket's key")
	if err := setup.rekeyDisk(ctx, t.GetStateDiskKey(), t.GetMeasurementSalt()); err != nil {
		return err
	}
	setup.Log.Info("Installing the pinned components", "kubernetesVersion", t.GetKubernetesVersion(), "count", len(t.GetKubernetesComponents()))
	if err := setup.Installer.Install(ctx, t.GetKubernetesComponents()); err != nil {
		return err
	}
	params := kubeadm.JoinParams{
		Node:              setup.Node,
		Kubelet:           setup.Kubelet,
		APIServerEndpoint: t.GetApiServerEndpoint(),
		Token:             t.GetToken(),
		CACertHash:        t.GetDiscoveryTokenCaCertHash(),
		ControlPlane:      c.cfg.ControlPlane,
		PatchesDir:        setup.path(KubeadmDir + "/patches"),
	}
	config, patches, err := params.Render()
	if err != nil {
		return err
	}
	configPath := KubeadmDir + "/join.yaml"
	defer func() {
		// It holds the bootstrap token.
		if err := removeFile(setup.path(configPath)); err != nil {
			setup.Log.Warn("Removing the join configuration failed", "error", err.Error())
		}
	}()
	var last error
	for attempt := 1; attempt <= c.cfg.KubeadmAttempts; attempt++ {
		if attempt > 1 {
			// A failed join leaves files that fail the next one's preflight.
			out, err := setup.Kubeadm.Run(ctx, "reset", "--force")
			if err != nil {
				setup.Log.Warn("kubeadm reset before retrying failed", "error", err.Error(), "output", string(out))
			}
		}
		if err := c.writeJoinFiles(t, kubeletKey, configPath, config, patches); err != nil {
			return err
		}
		setup.Log.Info("Running kubeadm join", "attempt", attempt, "of", c.cfg.KubeadmAttempts)
		out, err := setup.Kubeadm.Run(ctx, "join", "--config", setup.path(configPath))
		if err == nil {
			return nil
		}
		last = fmt.Errorf("kubeadm join (attempt %d of %d): %w\n%s", attempt, c.cfg.KubeadmAttempts, err, logtail.Lines(string(out), 20))
		setup.Log.Warn("kubeadm join failed", "attempt", attempt, "error", err.Error(), "output", logtail.Lines(string(out), 20))
	}
	return last
}

// writeJoinFiles writes the kubelet certificate, a control plane's PKI
// files (keys 0600, certificates 0644) and the kubeadm configuration.
func (c *JoinClient) writeJoinFiles(t *joinservicev1.IssueJoinTicketResponse, kubeletKey []byte, configPath string, config []byte, patches map[string][]byte) error {
	setup := c.cfg.Setup
	if setup.Kubelet.ServingCert {
		if err := writeKubeletCert(setup, t.GetKubeletCert(), kubeletKey); err != nil {
			return err
		}
	}
	for _, f := range t.GetControlPlaneFiles() {
		name := path.Clean("/" + f.GetName())
		if name != "/"+f.GetName() || strings.HasPrefix(f.GetName(), ".") {
			return fmt.Errorf("join ticket names control-plane file %q outside the PKI directory", f.GetName())
		}
		mode := fs.FileMode(0o644)
		if strings.HasSuffix(name, ".key") {
			mode = 0o600
		}
		if err := setup.writeFile(kubeadm.PKIDir+name, f.GetData(), mode); err != nil {
			return err
		}
	}
	for name, data := range patches {
		if err := setup.writeFile(KubeadmDir+"/patches/"+name, data, 0o600); err != nil {
			return err
		}
	}
	return setup.writeFile(configPath, config, 0o600)
}
