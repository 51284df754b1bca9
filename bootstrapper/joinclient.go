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

	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
	"github.com/gatehouse-dev/gatehouse/internal/logtail"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kmsplugin"
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
	return waitFor(ctx, d/2+rand.N(d/2+1), stop) //nolint:gosec // jitter, not a secret
}

// waitFor sleeps for d, until ctx ends (its error) or until stop is
// closed (nodelock.ErrLocked).
func waitFor(ctx context.Context, d time.Duration, stop <-chan struct{}) error {
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

// JoinClientConfig holds a JoinClient's dependencies.
type JoinClientConfig struct {
	Machine *Machine
	Lock    *nodelock.Lock
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
	cfg   JoinClientConfig
	calls *joinServiceCalls
}

// FailedError is a failure after the node lock: the node cannot go back
// and must be reset (its state disk is marked for reset).
type FailedError struct{ Err error }

func (e *FailedError) Error() string {
	return "bootstrap failed after the node lock; the node must be reset (rebooted with a fresh state disk): " + e.Err.Error()
}
func (e *FailedError) Unwrap() error { return e.Err }

// NewJoinClient returns a JoinClient.
func NewJoinClient(cfg JoinClientConfig) (*JoinClient, error) {
	if cfg.Machine == nil || cfg.Lock == nil || cfg.Endpoints == nil || cfg.Attester == nil {
		return nil, errors.New("join client: Machine, Lock, Endpoints and Attester are required")
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
	if _, err := joinCredentials(cfg.Attester, cfg.CACertHash, cfg.Now); err != nil {
		return nil, fmt.Errorf("join client: %w", err)
	}
	return &JoinClient{cfg: cfg, calls: &joinServiceCalls{
		log: cfg.Machine.Log, lock: cfg.Lock, endpoints: cfg.Endpoints, attester: cfg.Attester,
		caCertHash: cfg.CACertHash, backoff: cfg.Backoff, now: cfg.Now,
	}}, nil
}

// Join gets a join ticket, retrying with backoff until ctx ends or the
// lock is taken by someone else (nodelock.ErrLocked), then takes the node
// lock and joins. Errors after the lock are *FailedError.
func (c *JoinClient) Join(ctx context.Context) error {
	machine := c.cfg.Machine
	diskUUID, err := machine.Disk.UUID(ctx)
	if err != nil {
		return err
	}
	ip := net.ParseIP(machine.Node.AdvertiseAddress)
	csr, kubeletKey, err := clusterpki.NewKubeletCSR(machine.Node.Name, []net.IP{ip})
	if err != nil {
		return err
	}
	req := &joinservicev1.IssueJoinTicketRequest{DiskUuid: diskUUID, CertificateRequest: csr, IsControlPlane: c.cfg.ControlPlane}
	var ticket *joinservicev1.IssueJoinTicketResponse
	err = c.calls.call(ctx, "join ticket", func(ctx context.Context, client joinservicev1.JoinServiceClient) error {
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
	// What the ticket carries is checked before anything on the node
	// changes.
	if _, err := ticketKEKs(ticket); err != nil {
		return err
	}
	if err := c.cfg.Lock.TryLock("join", id); err != nil {
		return err
	}
	machine.recordStatus(bootstrapstatus.PhaseJoining, nil, c.cfg.Now())
	if err := c.setUp(ctx, ticket, kubeletKey); err != nil {
		return c.cfg.Machine.markFailed(err, c.cfg.Now())
	}
	if err := machine.syncState(); err != nil {
		return machine.markFailed(err, c.cfg.Now())
	}
	machine.recordStatus(bootstrapstatus.PhaseDone, nil, c.cfg.Now())
	machine.Log.Info("Joined the cluster", "controlPlane", c.cfg.ControlPlane)
	return nil
}

// setUp does what follows the lock: re-key, install, files, kubeadm join.
func (c *JoinClient) setUp(ctx context.Context, t *joinservicev1.IssueJoinTicketResponse, kubeletKey []byte) error {
	machine := c.cfg.Machine
	machine.Log.Info("Re-keying the state disk with the join ticket's key")
	if err := machine.rekeyDisk(ctx, t.GetStateDiskKey(), t.GetMeasurementSalt()); err != nil {
		return err
	}
	machine.Log.Info("Installing the pinned components", "kubernetesVersion", t.GetKubernetesVersion(), "count", len(t.GetKubernetesComponents()))
	if err := machine.Installer.Install(ctx, t.GetKubernetesComponents()); err != nil {
		return err
	}
	if err := machine.writeImageMirror(t.GetImageMirror()); err != nil {
		return err
	}
	params := kubeadm.JoinParams{
		Node:              machine.Node,
		Kubelet:           machine.Kubelet,
		APIServerEndpoint: t.GetApiServerEndpoint(),
		Token:             t.GetToken(),
		CACertHash:        t.GetDiscoveryTokenCaCertHash(),
		ControlPlane:      c.cfg.ControlPlane,
		PatchesDir:        machine.path(KubeadmPatchesDir),
	}
	config, patches, err := params.Render()
	if err != nil {
		return err
	}
	configPath := kubeadmDir + "/join.yaml"
	defer func() {
		// It holds the bootstrap token.
		if err := removeFile(machine.path(configPath)); err != nil {
			machine.Log.Warn("Removing the join configuration failed", "error", err.Error())
		}
	}()
	var last error
	for attempt := 1; attempt <= c.cfg.KubeadmAttempts; attempt++ {
		if attempt > 1 {
			// A failed join leaves files that fail the next one's preflight.
			out, err := machine.Kubeadm.Run(ctx, "reset", "--force")
			if err != nil {
				machine.Log.Warn("kubeadm reset before retrying failed", "error", err.Error(), "output", string(out))
			}
		}
		if err := c.writeJoinFiles(t, kubeletKey, configPath, config, patches); err != nil {
			return err
		}
		machine.Log.Info("Running kubeadm join", "attempt", attempt, "of", c.cfg.KubeadmAttempts)
		out, err := machine.Kubeadm.Run(ctx, "join", "--config", machine.path(configPath))
		if err == nil {
			return nil
		}
		last = fmt.Errorf("kubeadm join (attempt %d of %d): %w\n%s", attempt, c.cfg.KubeadmAttempts, err, logtail.Lines(string(out), 20))
		machine.Log.Warn("kubeadm join failed", "attempt", attempt, "error", err.Error(), "output", logtail.Lines(string(out), 20))
	}
	return last
}

// ticketKEKs returns the KMS v2 key-encryption keys a control plane's
// ticket carries (nil for none), refusing a generation below 1, one given
// twice, or a key not keys.EtcdEncryptionKeySize bytes long.
func ticketKEKs(t *joinservicev1.IssueJoinTicketResponse) (kmsplugin.KEKs, error) {
	ks := t.GetEtcdEncryptionKeys()
	if len(ks) == 0 {
		return nil, nil
	}
	keks := kmsplugin.KEKs{}
	for _, k := range ks {
		g := int(k.GetGeneration())
		if _, dup := keks[g]; dup {
			return nil, fmt.Errorf("join ticket: KMS v2 key-encryption key generation %d given twice", g)
		}
		keks[g] = k.GetKey()
	}
	if _, err := kmsplugin.MarshalKEKs(keks); err != nil {
		return nil, fmt.Errorf("join ticket: KMS v2 key-encryption keys: %w", err)
	}
	return keks, nil
}

// writeJoinFiles writes the kubelet certificate, a control plane's PKI
// files (keys 0600, certificates 0644) and the kubeadm configuration.
func (c *JoinClient) writeJoinFiles(t *joinservicev1.IssueJoinTicketResponse, kubeletKey []byte, configPath string, config []byte, patches map[string][]byte) error {
	machine := c.cfg.Machine
	if machine.Kubelet.ServingCert {
		if err := machine.writeServingCert(t.GetKubeletCert(), kubeletKey, c.cfg.Now()); err != nil {
			return err
		}
	}
	if c.cfg.ControlPlane {
		// The cluster's API server configuration mounts it
		// (kubeadm.InitParams), on every control plane.
		if err := machine.writeAuditPolicy(); err != nil {
			return err
		}
		keks, err := ticketKEKs(t)
		if err != nil {
			return err
		}
		if keks != nil {
			if err := machine.writeSecretsEncryption(keks); err != nil {
				return err
			}
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
		if err := machine.writeFile(kubeadm.PKIDir+name, f.GetData(), mode); err != nil {
			return err
		}
	}
	for name, data := range patches {
		if err := machine.writeFile(KubeadmPatchesDir+"/"+name, data, 0o600); err != nil {
			return err
		}
	}
	return machine.writeFile(configPath, config, 0o600)
}
