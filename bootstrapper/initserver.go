package bootstrapper

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"

	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/components"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kmsplugin"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

// defaultAdminName is the user name of the admin kubeconfig Init returns.
const defaultAdminName = "gatehouse-admin"

// InitServerConfig holds an InitServer's dependencies.
type InitServerConfig struct {
	Machine *Machine
	Lock    *nodelock.Lock
	// Identity is the node's attestation identity, as verifiers see it in
	// its evidence (attestation.Result.Identity); the state disk key is
	// bound to it, as the join service binds a joining node's
	// (keys.DiskKeyID), so a rejoin after a reboot gets the same key.
	Identity string
	// BindName binds the node's name to Identity in the new cluster
	// (BindNodeName), as the join service binds every joiner: continuous
	// attestation checks running nodes against the bindings.
	BindName NameBinder
	// InitSecretHash is the bcrypt hash of the init secret the node was
	// provisioned with; nil when it was provisioned with none, and then
	// every Init is refused (FailedPrecondition): the node can only join,
	// rejoin or be recovered.
	InitSecretHash []byte
	// AdminName is the admin kubeconfig's user; "" is DefaultAdminName.
	AdminName string
	// ImageRepository, SkipPhases, KubeProxy and ControlPlaneEnv go into
	// kubeadm's init configuration (e.g. locally built images, skipped
	// add-ons, the kube-proxy settings of nodes in network namespaces, and
	// the Go memory settings of a local cluster's control planes). An
	// InitRequest's image_repository (the cluster configuration's mirror)
	// takes the place of ImageRepository.
	ImageRepository string
	SkipPhases      []string
	KubeProxy       kubeadm.KubeProxyOptions
	ControlPlaneEnv []kubeadm.ComponentEnv
	// ControlPlaneWait is kubeadm init's wait for the control plane
	// (kubeadm.InitParams.ControlPlaneWait); 0 is kubeadm's.
	ControlPlaneWait time.Duration
	// LeaderElectionLease is the controller manager's and scheduler's
	// leader-election lease (kubeadm.InitParams.LeaderElectionLease); 0
	// is their default.
	LeaderElectionLease time.Duration
	// EncryptSecrets makes the cluster's API servers encrypt Secrets in
	// etcd with the KMS v2 plugin each control plane serves (`serve-kms`)
	// from a KEK derived from the master secret (docs/keys.md).
	EncryptSecrets bool
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// SecretAttempts bound guessing the init secret; zero is
	// DefaultSecretAttemptLimits.
	SecretAttempts SecretAttemptLimits
	// Registerer registers gatehouse_bootstrapper_init_refused_total; nil
	// registers nothing.
	Registerer prometheus.Registerer
}

// InitServer serves InitService: it makes this node the first control
// plane of a new cluster. One init runs per node; the job outlives the
// stream that started it, so a client whose connection dropped can send
// the same request again and follows the same job to its result.
type InitServer struct {
	initservicev1.UnimplementedInitServiceServer
	cfg      InitServerConfig
	attempts *secretAttempts
	// compare reports whether secret is the init secret; it holds no lock
	// (bcrypt compares in constant time).
	compare func(secret []byte) bool

	mu  sync.Mutex
	job *initJob

	finished  chan struct{} // closed when the job has a result
	delivered chan struct{} // closed when a client received the result
	deliverMu sync.Once

	// lifetime is the init job's context: the server's, not the stream's
	// (the job outlives a dropped stream), cancelled by Stop.
	lifetime context.Context
	stop     context.CancelFunc
}

// NewInitServer returns an InitServer.
func NewInitServer(cfg InitServerConfig) (*InitServer, error) {
	if cfg.Machine == nil || cfg.Lock == nil || cfg.Identity == "" || cfg.BindName == nil {
		return nil, errors.New("init server: Machine, Lock, Identity and BindName are required")
	}
	if cfg.InitSecretHash != nil {
		if _, err := bcrypt.Cost(cfg.InitSecretHash); err != nil {
			return nil, fmt.Errorf("init server: the provisioned init secret hash is not a bcrypt hash: %w", err)
		}
	}
	if cfg.AdminName == "" {
		cfg.AdminName = defaultAdminName
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SecretAttempts == (SecretAttemptLimits{}) {
		cfg.SecretAttempts = DefaultSecretAttemptLimits
	}
	attempts, err := newSecretAttempts(cfg.SecretAttempts, cfg.Now, cfg.Registerer, initAttemptMetric)
	if err != nil {
		return nil, fmt.Errorf("init server: %w", err)
	}
	hash := cfg.InitSecretHash
	compare := func(secret []byte) bool { return bcrypt.CompareHashAndPassword(hash, secret) == nil }
	lifetime, stop := context.WithCancel(context.Background())
	return &InitServer{cfg: cfg, attempts: attempts, compare: compare, finished: make(chan struct{}), delivered: make(chan struct{}),
		lifetime: lifetime, stop: stop}, nil
}

// Stop ends the server's lifetime: a running init job is cancelled (kubeadm
// is killed; past the node lock the node is marked for reset, as after any
// failure there) and Finished closes once it has ended. The bootstrapper
// calls it on SIGTERM. Safe to call more than once.
func (s *InitServer) Stop() { s.stop() }

// Finished is closed once an init has ended; Result then returns how.
func (s *InitServer) Finished() <-chan struct{} { return s.finished }

// Delivered is closed once a client has received the init's final message.
func (s *InitServer) Delivered() <-chan struct{} { return s.delivered }

// Result returns the init's error (nil on success); valid after Finished.
func (s *InitServer) Result() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.job == nil {
		return errors.New("no init ran")
	}
	return s.job.err
}

// initJob is one init: its request fingerprint and the messages so far.
type initJob struct {
	fingerprint [sha256.Size]byte

	mu      sync.Mutex
	events  []*initservicev1.InitResponse
	changed chan struct{} // closed and replaced on every new event
	done    bool
	err     error
	logs    bytes.Buffer // what a failure sends back; never secrets
}

func (j *initJob) emit(ev *initservicev1.InitResponse) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, ev)
	if ev.GetSuccess() != nil || ev.GetFailure() != nil {
		j.done = true
	}
	close(j.changed)
	j.changed = make(chan struct{})
}

func (j *initJob) progress(step, msg string) {
	j.emit(&initservicev1.InitResponse{Kind: &initservicev1.InitResponse_Progress{Progress: &initservicev1.InitProgress{Step: step, Message: msg}}})
}

// snapshot returns the events from index from on, whether the last of all
// is final, and a channel closed on the next event.
func (j *initJob) snapshot(from int) ([]*initservicev1.InitResponse, bool, <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.events[from:], j.done, j.changed
}

// Init creates the cluster (see InitService). Errors: InvalidArgument for a
// malformed request, naming the field; ResourceExhausted while the caller's
// source backs off after wrong init secrets, saying when to retry, or while
// another secret of its source is being compared (SecretAttemptLimits);
// PermissionDenied for a wrong init secret; FailedPrecondition when the
// node joins another cluster or is being initialised with a different
// request. None of them change the node. Secrets are compared without a
// lock, beside those of other sources: only the start of the job after a
// right secret is serialised.
func (s *InitServer) Init(req *initservicev1.InitRequest, stream initservicev1.InitService_InitServer) error {
	plan, err := s.plan(req)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if s.cfg.InitSecretHash == nil {
		s.cfg.Machine.Log.Warn("Init refused: this node was provisioned without an init secret hash")
		return status.Error(codes.FailedPrecondition, "this node was provisioned without an init secret hash, so it cannot be initialised: it can only join, rejoin or be recovered; provision the hash (--init-secret-hash-file) on the node meant to be the first control plane")
	}
	source := ""
	if p, ok := peer.FromContext(stream.Context()); ok {
		source = connlimit.Source(p.Addr)
	}
	if reason, wait := s.attempts.begin(source); reason != "" {
		s.cfg.Machine.Log.Warn("Init refused before comparing the init secret", "source", source, "reason", reason, "retryAfter", wait.Round(time.Millisecond).String())
		return status.Error(codes.ResourceExhausted, "too many init secrets tried ("+reason+"); "+retryHint(reason, wait))
	}
	if !s.compare(req.GetInitSecret()) {
		s.attempts.wrong(source)
		s.cfg.Machine.Log.Warn("Init refused: wrong init secret", "source", source)
		return status.Error(codes.PermissionDenied, "the init secret does not match the one this node was provisioned with")
	}
	s.attempts.right(source)
	job, err := s.attach(plan)
	if err != nil {
		return err
	}
	return s.follow(stream, job)
}

// retryHint says when a source refused by secretAttempts may try again.
func retryHint(reason string, wait time.Duration) string {
	if reason == reasonSourceBusy {
		return "retry once the other attempt from this address has its answer"
	}
	return "retry in " + wait.Round(time.Millisecond).String()
}

// attach returns the running job for plan, starting it if none runs.
func (s *InitServer) attach(p *initPlan) (*initJob, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.job != nil {
		if s.job.fingerprint != p.fingerprint {
			return nil, status.Error(codes.FailedPrecondition, "this node is already being initialised with a different request; wait for it or reset the node")
		}
		return s.job, nil
	}
	if s.cfg.Lock.Locked() {
		return nil, status.Error(codes.FailedPrecondition, "this node is joining an existing cluster (its node lock is taken); it cannot be initialised")
	}
	s.job = &initJob{fingerprint: p.fingerprint, changed: make(chan struct{})}
	go s.run(s.job, p)
	return s.job, nil
}

// follow streams the job's events from the start until its final one.
func (s *InitServer) follow(stream initservicev1.InitService_InitServer, j *initJob) error {
	sent := 0
	for {
		events, done, changed := j.snapshot(sent)
		for _, ev := range events {
			if err := stream.Send(ev); err != nil {
				return err
			}
			sent++
		}
		if done {
			s.deliverMu.Do(func() { close(s.delivered) })
			return nil
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			// The job goes on; the client can follow it again.
			return status.FromContextError(stream.Context().Err()).Err()
		}
	}
}

// initPlan is a checked request with everything derived from it.
type initPlan struct {
	req         *initservicev1.InitRequest
	fingerprint [sha256.Size]byte
	derive      *kms.ClusterKMS
	clusterID   []byte
	params      kubeadm.InitParams
	// keks are the KMS v2 plugin's, when Secrets are encrypted.
	keks kmsplugin.KEKs
}

// plan checks req and derives the cluster ID and kubeadm configuration, all
// before anything on the node changes.
func (s *InitServer) plan(req *initservicev1.InitRequest) (*initPlan, error) {
	parsed, err := kms.ParseURI(req.GetKmsUri())
	if err != nil {
		return nil, fmt.Errorf("kms_uri: %w", err)
	}
	uri, ok := parsed.(*kms.ClusterKMSURI)
	if !ok {
		return nil, errors.New("kms_uri: the first node derives keys itself and needs kms://cluster-kms?key=…&salt=…")
	}
	derive, err := kms.NewClusterKMS(uri.MasterSecret, uri.Salt)
	if err != nil {
		return nil, fmt.Errorf("kms_uri: %w", err)
	}
	if err := checkKeyServiceURI(req.GetKeyServiceKmsUri(), uri.Salt); err != nil {
		return nil, fmt.Errorf("key_service_kms_uri: %w", err)
	}
	if len(req.GetMeasurementSalt()) != keys.MeasurementSaltSize {
		return nil, fmt.Errorf("measurement_salt has %d bytes, want %d", len(req.GetMeasurementSalt()), keys.MeasurementSaltSize)
	}
	if len(req.GetKubernetesComponents()) == 0 {
		return nil, errors.New("kubernetes_components is empty: send the pinned components of kubernetes_version")
	}
	for i, c := range req.GetKubernetesComponents() {
		if err := components.Validate(c); err != nil {
			return nil, fmt.Errorf("kubernetes_components[%d]: %w", i, err)
		}
	}
	if _, err := mirror.ContainerdHostsFiles(req.GetImageMirror()); err != nil {
		return nil, fmt.Errorf("image_mirror: %w", err)
	}
	secret, err := derive.GetDataKey(context.Background(), keys.MeasurementSecretID, keys.MeasurementSecretSize)
	if err != nil {
		return nil, err
	}
	id, err := keys.DeriveClusterID(secret, req.GetMeasurementSalt())
	if err != nil {
		return nil, err
	}
	token, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return nil, err
	}
	params := kubeadm.InitParams{
		Node:                 s.cfg.Machine.Node,
		Kubelet:              s.cfg.Machine.Kubelet,
		ClusterName:          req.GetClusterName(),
		KubernetesVersion:    req.GetKubernetesVersion(),
		CertSANs:             req.GetApiServerCertSans(),
		ControlPlaneEndpoint: req.GetControlPlaneEndpoint(),
		ServiceCIDR:          req.GetServiceCidr(),
		PodCIDR:              req.GetPodCidr(),
		InitToken:            token,
		KubeletCertLifetime:  kubeletCertLifetime(req.GetKubeletCertLifetimeSeconds()),
		ImageRepository:      cmp.Or(req.GetImageRepository(), s.cfg.ImageRepository),
		SkipPhases:           s.cfg.SkipPhases,
		KubeProxy:            s.cfg.KubeProxy,
		ControlPlaneEnv:      s.cfg.ControlPlaneEnv,
		ControlPlaneWait:     s.cfg.ControlPlaneWait,
		LeaderElectionLease:  s.cfg.LeaderElectionLease,
		EncryptSecrets:       s.cfg.EncryptSecrets,
	}
	if _, err := params.Render(); err != nil {
		return nil, err
	}
	var keks kmsplugin.KEKs
	if s.cfg.EncryptSecrets {
		kek, err := derive.GetDataKey(context.Background(), keys.EtcdEncryptionKeyID(keys.EtcdEncryptionGeneration), keys.EtcdEncryptionKeySize)
		if err != nil {
			return nil, err
		}
		keks = kmsplugin.KEKs{keys.EtcdEncryptionGeneration: kek}
	}
	// The fingerprint identifies the request without its init secret.
	withoutSecret := proto.CloneOf(req)
	withoutSecret.InitSecret = nil
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(withoutSecret)
	if err != nil {
		return nil, err
	}
	return &initPlan{req: req, fingerprint: sha256.Sum256(data), derive: derive, clusterID: id, params: params, keks: keks}, nil
}

// kubeletCertLifetime is the request's lifetime in seconds, or the default.
func kubeletCertLifetime(seconds uint32) time.Duration {
	if seconds == 0 {
		return kubeadm.DefaultKubeletCertLifetime
	}
	return time.Duration(seconds) * time.Second
}

// run executes the init and records its end.
func (s *InitServer) run(j *initJob, p *initPlan) {
	log := slog.New(slog.NewTextHandler(&j.logs, nil)).With("component", "init")
	result, err := s.execute(s.lifetime, j, p, log)
	if err == nil {
		err = s.cfg.Machine.syncState()
	}
	now := s.cfg.Now()
	if err != nil {
		s.cfg.Machine.Log.Error("Init failed", "error", err.Error())
		log.Error("Init failed", "error", err.Error())
		if get := s.cfg.Machine.KubeletLogs; get != nil && s.cfg.Lock.Holder() == "init" {
			kubelet, kerr := get(context.Background())
			if kerr != nil {
				log.Warn("Reading the kubelet's log failed", "error", kerr.Error())
			}
			log.Info("kubelet log", "output", string(kubelet))
		}
		if s.cfg.Lock.Holder() == "init" {
			// Past the point of no return: report and mark for reset.
			_ = s.cfg.Machine.markFailed(err, now)
		}
		j.mu.Lock()
		j.err = err
		logs := gzipBytes(j.logs.Bytes())
		j.mu.Unlock()
		j.emit(&initservicev1.InitResponse{Kind: &initservicev1.InitResponse_Failure{Failure: &initservicev1.InitFailure{Error: err.Error(), LogsGzip: logs}}})
	} else {
		s.cfg.Machine.recordStatus(bootstrapstatus.PhaseDone, nil, now)
		j.emit(&initservicev1.InitResponse{Kind: &initservicev1.InitResponse_Success{Success: result}})
		s.cfg.Machine.Log.Info("Init succeeded: this node is the cluster's first control plane")
	}
	close(s.finished)
}

// execute takes the lock and creates the cluster.
func (s *InitServer) execute(ctx context.Context, j *initJob, p *initPlan, log *slog.Logger) (*initservicev1.InitSuccess, error) {
	machine := s.cfg.Machine
	step := func(name, msg string) {
		machine.Log.Info(msg, "step", name)
		log.Info(msg, "step", name)
		j.progress(name, msg)
	}
	step("node-lock", "Taking the node lock (extending PCR 15 with the cluster ID)")
	if err := s.cfg.Lock.TryLock("init", p.clusterID); err != nil {
		if errors.Is(err, nodelock.ErrLocked) {
			return nil, errors.New("this node is joining an existing cluster (its node lock is taken); it cannot be initialised")
		}
		return nil, err
	}
	machine.recordStatus(bootstrapstatus.PhaseInitialising, nil, s.cfg.Now())

	step("rekey-state-disk", "Re-keying the state disk with the key derived from the master secret")
	diskUUID, err := machine.Disk.UUID(ctx)
	if err != nil {
		return nil, err
	}
	diskKeyID, err := keys.DiskKeyID(s.cfg.Identity, diskUUID)
	if err != nil {
		return nil, err
	}
	diskKey, err := p.derive.GetDataKey(ctx, diskKeyID, keys.StateDiskKeySize)
	if err != nil {
		return nil, err
	}
	if err := machine.rekeyDisk(ctx, diskKey, p.req.GetMeasurementSalt()); err != nil {
		return nil, err
	}

	step("install-components", fmt.Sprintf("Installing the %d pinned components of Kubernetes %s", len(p.req.GetKubernetesComponents()), p.req.GetKubernetesVersion()))
	if err := machine.Installer.Install(ctx, p.req.GetKubernetesComponents()); err != nil {
		return nil, err
	}
	if im := p.req.GetImageMirror(); im != nil {
		step("image-mirror", "Pulling images from the mirror "+im.GetRegistry())
		if err := machine.writeImageMirror(im); err != nil {
			return nil, err
		}
	}

	step("pki", "Generating the cluster CA and this node's kubelet serving certificate")
	ca, err := s.writePKI(machine, p)
	if err != nil {
		return nil, err
	}

	step("kubeadm-config", "Writing the kubeadm configuration and audit policy")
	configPath := kubeadmDir + "/init.yaml"
	if err := s.writeInitFiles(machine, p, configPath); err != nil {
		return nil, err
	}

	step("kubeadm-init", "Running kubeadm init")
	out, err := machine.Kubeadm.Run(ctx, "init", "--config", machine.path(configPath), "--skip-token-print")
	log.Info("kubeadm init output", "output", string(out))
	if err != nil {
		return nil, fmt.Errorf("kubeadm init failed: %w (its output is in the logs)", err)
	}
	tokenID, _, _ := strings.Cut(p.params.InitToken, ".")
	if out, err := machine.Kubeadm.Run(ctx, "token", "delete", tokenID, "--kubeconfig", machine.path("/etc/kubernetes/admin.conf")); err != nil {
		// It expires by itself within kubeadm.InitTokenTTL.
		log.Warn("Deleting kubeadm init's bootstrap token failed", "error", err.Error(), "output", string(out))
	}
	if err := removeFile(machine.path(configPath)); err != nil {
		log.Warn("Removing the init configuration failed", "error", err.Error())
	}

	step("node-binding", "Binding this node's name to its attestation identity")
	if err := s.cfg.BindName(ctx, machine.path("/etc/kubernetes/admin.conf"), machine.Node.Name, s.cfg.Identity); err != nil {
		return nil, fmt.Errorf("binding the node name %s: %w", machine.Node.Name, err)
	}

	step("admin-kubeconfig", "Issuing the admin kubeconfig for "+s.cfg.AdminName)
	kubeconfig, err := s.adminKubeconfig(ca, p)
	if err != nil {
		return nil, err
	}
	return &initservicev1.InitSuccess{Kubeconfig: kubeconfig, ClusterId: p.clusterID}, nil
}

// writePKI writes a new cluster CA where kubeadm init finds and keeps it,
// and this node's kubelet credentials signed by it with the cluster's
// kubelet certificate lifetime: its serving certificate, and its client
// certificate in kubelet.conf (which kubeadm keeps, as it does a
// kubeconfig with the cluster's CA; without it kubeadm would sign one
// valid for a year). The kubelet renews both through CSRs.
func (s *InitServer) writePKI(machine *Machine, p *initPlan) (*clusterpki.CA, error) {
	now := s.cfg.Now()
	ca, certPEM, keyPEM, err := clusterpki.GenerateCA(now)
	if err != nil {
		return nil, err
	}
	if err := machine.writeFile(kubeadm.PKIDir+"/ca.crt", certPEM, 0o644); err != nil {
		return nil, err
	}
	if err := machine.writeFile(kubeadm.PKIDir+"/ca.key", keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeKubeletKubeconfig(machine, ca, certPEM, p.params, now); err != nil {
		return nil, err
	}
	if machine.Kubelet.ServingCert {
		if err := writeInitServingCert(machine, ca, now, p.params.KubeletCertLifetime); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// writeKubeletKubeconfig writes kubelet.conf for this node's kubelet: the
// local API server, the cluster CA, and a client certificate of params'
// kubelet certificate lifetime.
func writeKubeletKubeconfig(machine *Machine, ca *clusterpki.CA, caPEM []byte, params kubeadm.InitParams, now time.Time) error {
	certPEM, keyPEM, err := ca.SignKubeletClient(params.Node.Name, now, params.KubeletCertLifetime)
	if err != nil {
		return err
	}
	port := params.BindPort
	if port == 0 {
		port = 6443
	}
	user := "system:node:" + params.Node.Name
	context := user + "@" + params.ClusterName
	config := clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{params.ClusterName: {
			Server:                   "https://" + net.JoinHostPort(params.Node.AdvertiseAddress, strconv.Itoa(int(port))),
			CertificateAuthorityData: caPEM,
		}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {ClientCertificateData: certPEM, ClientKeyData: keyPEM}},
		Contexts:       map[string]*clientcmdapi.Context{context: {Cluster: params.ClusterName, AuthInfo: user}},
		CurrentContext: context,
	}
	data, err := clientcmd.Write(config)
	if err != nil {
		return fmt.Errorf("writing the kubelet's kubeconfig: %w", err)
	}
	return machine.writeFile(kubeadm.KubeletKubeconfigPath, data, 0o600)
}

// writeInitServingCert issues this node's kubelet serving certificate with
// ca, valid lifetime, and puts it in the kubelet's serving certificate store.
func writeInitServingCert(machine *Machine, ca *clusterpki.CA, now time.Time, lifetime time.Duration) error {
	csr, keyPEM, err := clusterpki.NewKubeletCSR(machine.Node.Name, []net.IP{net.ParseIP(machine.Node.AdvertiseAddress)})
	if err != nil {
		return err
	}
	req, err := clusterpki.ParseKubeletCSR(csr)
	if err != nil {
		return err
	}
	der, err := ca.SignKubelet(req, now, lifetime)
	if err != nil {
		return err
	}
	return machine.writeServingCert(der, keyPEM, now)
}

func (s *InitServer) writeInitFiles(machine *Machine, p *initPlan, configPath string) error {
	if err := machine.writeAuditPolicy(); err != nil {
		return err
	}
	if p.keks != nil {
		if err := machine.writeSecretsEncryption(p.keks); err != nil {
			return err
		}
	}
	config, err := p.params.Render()
	if err != nil {
		return err
	}
	if err := machine.writeFile(configPath, config, 0o600); err != nil {
		return err
	}
	// The key service on this control plane derives keys from it; a
	// wrapped master secret is stored only wrapped.
	uri := p.req.GetKmsUri()
	if wrapped := p.req.GetKeyServiceKmsUri(); wrapped != "" {
		uri = wrapped
	}
	return machine.writeFile(kms.URIFile, []byte(uri), 0o600)
}

// checkKeyServiceURI accepts an empty URI or an external KMS URI carrying a
// wrapped master secret with the plain one's salt.
func checkKeyServiceURI(text string, salt []byte) error {
	if text == "" {
		return nil
	}
	parsed, err := kms.ParseURI(text)
	if err != nil {
		return err
	}
	w, ok := kms.External(parsed)
	switch {
	case !ok || !w.IsWrapped():
		return fmt.Errorf("want an external KMS URI carrying the wrapped master secret (kms://%s?…&wrapped=…&salt=… or kms://%s?…&wrapped=…&salt=…)", kms.BackendAWSKMS, kms.BackendVaultTransit)
	case !bytes.Equal(w.Salt, salt):
		return errors.New("its salt differs from kms_uri's: it wraps another cluster's master secret")
	}
	return nil
}

// adminKubeconfig returns a kubeconfig for the named admin, pointed at the
// controlPlaneEndpoint (the load balancer) when there is one, else at this
// node's API server.
func (s *InitServer) adminKubeconfig(ca *clusterpki.CA, p *initPlan) ([]byte, error) {
	certPEM, keyPEM, err := ca.SignAdmin(s.cfg.AdminName, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	server := "https://" + net.JoinHostPort(p.params.Node.AdvertiseAddress, strconv.Itoa(6443))
	if p.params.ControlPlaneEndpoint != "" {
		server = "https://" + p.params.ControlPlaneEndpoint
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate().Raw})
	name := p.params.ClusterName
	user := s.cfg.AdminName + "@" + name
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: name, AuthInfo: user}
	cfg.CurrentContext = user
	return clientcmd.Write(*cfg)
}

func gzipBytes(data []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(data)
	_ = zw.Close()
	return buf.Bytes()
}
