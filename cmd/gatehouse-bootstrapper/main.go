// Command gatehouse-bootstrapper turns a new machine into a Kubernetes node:
// it serves InitService (the first control plane) and runs the JoinClient
// (every other node) until one of them takes the node lock, then exits.
// `gatehouse-bootstrapper serve-evidence` instead serves the node's fresh
// evidence to verifiers such as `gatehouse verify` for as long as it runs.
// It only wires flags to package bootstrapper (docs/bootstrapper.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"

	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/installer"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/choose"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snpguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// Exit codes: 1 for errors before the node lock (systemd retries), 2 for
// a failure after it (the node must be reset; retrying cannot help).
const (
	exitError  = 1
	exitFailed = 2
)

func main() {
	level := new(slog.LevelVar)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if len(os.Args) > 1 && os.Args[1] == "serve-evidence" {
		if err := serveEvidence(log, os.Args[2:]); err != nil {
			log.Error("Serving evidence failed", slog.String("error", err.Error()))
			os.Exit(exitError)
		}
		return
	}
	if err := run(log, level); err != nil {
		log.Error("Bootstrap failed", slog.String("error", err.Error()))
		var failed *bootstrapper.FailedError
		if errors.As(err, &failed) {
			os.Exit(exitFailed)
		}
		os.Exit(exitError)
	}
}

func run(log *slog.Logger, level *slog.LevelVar) error {
	hostname, _ := os.Hostname()
	var (
		logLevel        = flag.String("log-level", "info", "debug, info, warn or error")
		nodeName        = flag.String("node-name", strings.ToLower(hostname), "Kubernetes node name")
		advertise       = flag.String("advertise-address", "", "this node's IP address (required; not loopback)")
		tpmPath         = flag.String("tpm", "/dev/tpmrm0", "TPM character device or swtpm Unix socket")
		variant         = flag.String("attestation", string(attestation.VariantTPM), attestationUsage)
		snpInterface    = flag.String("sev-snp-interface", string(snpguest.Auto), snpInterfaceUsage)
		pcrList         = flag.String("pcrs", "0,1,2,3,4,5,6,7,8,9,15", "SHA-256 PCRs to quote; must include 15")
		ekCert          = flag.String("ek-certificate", string(tpmattester.EKCertificateAuto), ekCertificateUsage)
		akSource        = flag.String("attestation-key", string(tpmattester.AKOwner), attestationKeyUsage)
		stateDisk       = flag.String("state-disk", "", "block device of the LUKS2 state disk (required)")
		mapperName      = flag.String("state-disk-mapper-name", "gatehouse-state", "device-mapper name of the opened state disk")
		stateMount      = flag.String("state-disk-mount", "/run/gatehouse/state", "where the opened state disk is mounted; /etc/kubernetes, /var/lib/kubelet, /var/lib/etcd and /etc/gatehouse are bound onto it")
		initListen      = flag.String("init-listen", ":9000", "attested TLS address of InitService")
		initSecretHash  = flag.String("init-secret-hash-file", "/etc/gatehouse/init-secret.bcrypt", "file with the bcrypt hash of the init secret")
		endpoints       = flag.String("join-endpoints", "", "comma-separated join service host:port list")
		endpointsFile   = flag.String("join-endpoints-file", "", "file listing join service host:port endpoints, one per line")
		caHash          = flag.String("cluster-ca-hash", "", "discovery token CA cert hash (sha256:<hex>) of the cluster to join")
		controlPlane    = flag.Bool("control-plane", false, "join as a control plane")
		joinBackoff     = flag.Duration("join-backoff", bootstrapper.DefaultBackoff.Initial, "first wait between rounds of calls to the join service's endpoints; doubles each round (with jitter)")
		joinBackoffMax  = flag.Duration("join-backoff-max", bootstrapper.DefaultBackoff.Max, "longest wait between rounds of calls to the join service's endpoints")
		root            = flag.String("root", "/", "file system root to install into")
		kubeadmPath     = flag.String("kubeadm", "/usr/local/bin/kubeadm", "kubeadm binary (installed from the pinned components)")
		criSocket       = flag.String("cri-socket", kubeadm.DefaultCRISocket, "container runtime endpoint")
		cgroupDriver    = flag.String("cgroup-driver", "systemd", "kubelet cgroup driver: systemd or cgroupfs")
		cgroupRoot      = flag.String("cgroup-root", "", "kubelet cgroup root (distinct per kubelet on one host)")
		allowCgroupV1   = flag.Bool("allow-cgroup-v1", false, "let the kubelet run on a cgroup v1 host")
		allowSwap       = flag.Bool("allow-swap", false, "let the kubelet start with swap on")
		sharedDisk      = flag.Bool("kubelet-shared-disk", false, "the kubelet shares the host's disk and cannot pull its images again (local cluster nodes): no image garbage collection, eviction for memory only")
		servingCert     = flag.Bool("kubelet-serving-cert", true, "serve the kubelet with a cluster-CA-signed certificate and verify kubelets in the API server")
		imageRepo       = flag.String("image-repository", "", "control-plane image repository for kubeadm init")
		pullPolicy      = flag.String("image-pull-policy", "", "control-plane image pull policy: Always, IfNotPresent or Never")
		skipPhases      = flag.String("skip-phases", "", "comma-separated kubeadm init phases to skip")
		proxyMasqAll    = flag.Bool("kube-proxy-masquerade-all", false, "kube-proxy SNATs all Service traffic (nodes whose pod bridge bypasses iptables)")
		proxyConntrack  = flag.Int("kube-proxy-conntrack-max-per-core", -1, "kube-proxy's conntrack.maxPerCore; 0 leaves nf_conntrack_max alone (nodes in network namespaces); -1 is kube-proxy's default")
		ignorePreflight = flag.String("ignore-preflight-errors", "", "comma-separated kubeadm preflight checks to ignore")
		kubeletService  = flag.String("kubelet-service", "systemd", "how the kubelet is restarted: systemd, or none when something else supervises it")
		successFile     = flag.String("success-file", "", "file written once the node is bootstrapped (Cluster API: /run/cluster-api/bootstrap-success.complete)")
		metricsListen   = flag.String("metrics-listen", "", "HTTP address of /metrics (init refusals, refused connections); empty: none")
		hsRate          = flag.Float64("init-handshake-rate", 1, "InitService connections per second per source address (each costs a TPM quote)")
		hsBurst         = flag.Int("init-handshake-burst", 5, "InitService connections a source address may open at once")
		maxSourceConns  = flag.Int("init-max-connections-per-source", 4, "open InitService connections per source address")
		maxConns        = flag.Int("init-max-connections", 64, "open InitService connections in all; at the cap the oldest connection without a request in flight is closed for a new one")
		hsTimeout       = flag.Duration("init-handshake-timeout", bootstrapper.DefaultInitPortLimits.HandshakeTimeout, "longest attested TLS handshake on InitService")
		maxIdle         = flag.Duration("init-max-connection-idle", bootstrapper.DefaultInitPortLimits.Listen.MaxIdle, "InitService (and RecoveryService) connections without a request in flight for this long are closed")
		freeAttempts    = flag.Int("init-secret-free-attempts", bootstrapper.DefaultSecretAttemptLimits.Free, "wrong init secrets (recovery keys on a rebooted node) a source may send before it backs off")
		attemptBackoff  = flag.Duration("init-secret-backoff", bootstrapper.DefaultSecretAttemptLimits.Backoff, "first wait after the free wrong init secrets; doubles with each further one")
		attemptMax      = flag.Duration("init-secret-max-backoff", bootstrapper.DefaultSecretAttemptLimits.MaxBackoff, "longest wait between init secret attempts of a source")
		attemptRate     = flag.Float64("init-secret-rate", bootstrapper.DefaultSecretAttemptLimits.Global.Rate, "init secrets compared per second over all sources with free attempts; past it a source's next wrong secret starts its backoff")
	)
	var nodeTaints []corev1.Taint
	flag.Func("node-taints", "taints the node registers with, key[=value]:Effect separated by commas, or \""+kubeadm.NoTaints+"\" for none; unset: kubeadm's default (a control plane's control-plane taint)", func(v string) (err error) {
		nodeTaints, err = kubeadm.ParseTaints(v)
		return err
	})
	var kubeletArgs []kubeadm.KubeletArg
	flag.Func("kubelet-arg", "a kubelet argument name=value (without --), e.g. node-labels=tier=web; repeatable; node labels follow NodeRestriction's rules; none by default", func(v string) error {
		a, err := kubeadm.ParseKubeletArg(v)
		kubeletArgs = append(kubeletArgs, a)
		return err
	})
	flag.Parse()
	if err := kubeadm.CheckRegistration(nodeTaints, kubeletArgs); err != nil {
		return fmt.Errorf("--node-taints and --kubelet-arg: %w", err)
	}
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if *advertise == "" || *stateDisk == "" {
		return errors.New("--advertise-address and --state-disk are required")
	}
	if *joinBackoff <= 0 || *joinBackoffMax < *joinBackoff {
		return fmt.Errorf("--join-backoff %s and --join-backoff-max %s: want 0 < backoff ≤ max", *joinBackoff, *joinBackoffMax)
	}
	pcrs, err := parsePCRs(*pcrList)
	if err != nil {
		return err
	}
	var source bootstrapper.EndpointSource
	switch {
	case *endpointsFile != "":
		source = bootstrapper.FileEndpoints(*endpointsFile)
	case *endpoints != "":
		source = bootstrapper.StaticEndpoints(strings.Split(*endpoints, ","))
	default:
		log.Warn("No join service endpoints: this node can only be initialised (gatehouse init)")
	}
	var kubelet bootstrapper.KubeletService
	switch *kubeletService {
	case "systemd":
		kubelet = bootstrapper.SystemdKubelet{}
	case "none":
		kubelet = bootstrapper.NoKubelet{}
	default:
		return fmt.Errorf("--kubelet-service %q: use systemd or none", *kubeletService)
	}
	hash, err := os.ReadFile(*initSecretHash)
	if err != nil {
		return fmt.Errorf("reading the init secret hash: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	node, err := choose.OpenAttester(choose.AttesterOptions{
		TPMPath: *tpmPath, PCRs: pcrs, Variant: *variant, EKCertificate: *ekCert, AttestationKey: *akSource, SNPInterface: *snpInterface,
	})
	if err != nil {
		return err
	}
	defer node.Close()
	attester := node.Attester
	logEndorsement(log, node.TPMAttester, attester)
	lock, err := nodelock.New(node.TPM)
	if err != nil {
		return err
	}
	disk, err := statedisk.New(*stateDisk)
	if err != nil {
		return err
	}
	setup := &bootstrapper.Machine{
		Root:      *root,
		Disk:      disk,
		Installer: installer.New(installer.Options{Log: log}),
		Kubeadm:   bootstrapper.ExecKubeadm{Path: *kubeadmPath},
		Node: kubeadm.Node{
			Name: *nodeName, AdvertiseAddress: *advertise, CRISocket: *criSocket,
			ImagePullPolicy: corev1.PullPolicy(*pullPolicy), IgnorePreflightErrors: splitList(*ignorePreflight),
			Taints: nodeTaints, KubeletExtraArgs: kubeletArgs,
		},
		Kubelet: kubeadm.KubeletOptions{
			CgroupDriver: *cgroupDriver, CgroupRoot: *cgroupRoot, AllowCgroupV1: *allowCgroupV1,
			AllowSwap: *allowSwap, SharedDisk: *sharedDisk, ServingCert: *servingCert,
		},
		Log:         log,
		KubeletLogs: bootstrapper.JournalKubeletLogs,
	}
	identity, err := node.TPMAttester.Identity()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	// The same limits bound init secrets on a new node and recovery keys
	// on a rebooted one (the port serves one door or the other).
	attempts := bootstrapper.SecretAttemptLimits{
		Free: *freeAttempts, Backoff: *attemptBackoff, MaxBackoff: *attemptMax,
		Global: connlimit.Rate{Rate: *attemptRate, Burst: bootstrapper.DefaultSecretAttemptLimits.Global.Burst},
	}
	initServer, err := bootstrapper.NewInitServer(bootstrapper.InitServerConfig{
		Machine: setup, Lock: lock, Identity: identity, InitSecretHash: []byte(strings.TrimSpace(string(hash))),
		BindName:        bootstrapper.BindNodeName,
		SecretAttempts:  attempts,
		Registerer:      reg,
		ImageRepository: *imageRepo, SkipPhases: splitList(*skipPhases),
		KubeProxy: kubeProxyOptions(*proxyMasqAll, *proxyConntrack),
	})
	if err != nil {
		return err
	}
	var join *bootstrapper.JoinClient
	if source != nil {
		if join, err = bootstrapper.NewJoinClient(bootstrapper.JoinClientConfig{
			Machine: setup, Lock: lock, Endpoints: source, Attester: attester,
			CACertHash: *caHash, ControlPlane: *controlPlane,
			Backoff: bootstrapper.Backoff{Initial: *joinBackoff, Max: *joinBackoffMax},
		}); err != nil {
			return err
		}
	}
	creds, err := atls.NewCredentials(atls.Config{Attester: attester})
	if err != nil {
		return err
	}
	inner, err := net.Listen("tcp", *initListen)
	if err != nil {
		return fmt.Errorf("listening for InitService: %w", err)
	}
	// Each anonymous handshake costs a TPM quote: limit them per source
	// before any attestation work, and close idle connections.
	lis, initGRPC, err := bootstrapper.ListenInitPort(inner, bootstrapper.InitPortConfig{
		Creds: creds, Log: log, Registerer: reg,
		Limits: bootstrapper.InitPortLimits{
			Listen: connlimit.Limits{
				Handshakes: connlimit.Rate{Rate: *hsRate, Burst: *hsBurst}, PerSource: *maxSourceConns, Total: *maxConns, MaxIdle: *maxIdle,
			},
			HandshakeTimeout: *hsTimeout,
		},
	})
	if err != nil {
		return err
	}
	if *metricsListen != "" {
		go serveMetrics(log, *metricsListen, reg)
	}
	cfg := bootstrapper.Config{
		Machine: setup, Lock: lock, Disk: disk,
		InitServer: initServer, InitGRPCServer: initGRPC, InitListener: lis,
		RecoveryAttempts: attempts, Registerer: reg,
		Join: join, Kubelet: kubelet, SuccessFile: *successFile,
	}
	if ok, why := statedisk.DeviceMapperAvailable(); ok {
		setup.State = &statedisk.Volume{Disk: disk, MapperName: *mapperName, MountPoint: *stateMount, Dirs: statedisk.StateDirs}
	} else {
		log.Warn("The state disk will not be opened: the node's state stays on the root file system", "reason", why)
	}
	return bootstrapper.Run(ctx, cfg)
}

// serveMetrics serves reg on addr until the process ends; the bootstrapper
// is short-lived, so a failure is logged, not fatal.
func serveMetrics(log *slog.Logger, addr string, reg *prometheus.Registry) {
	srv := &http.Server{Addr: addr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		log.Error("Serving metrics failed", "listen", addr, "error", err.Error())
	}
}

func parsePCRs(list string) ([]int, error) {
	var pcrs []int
	for _, f := range splitList(list) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n > 23 {
			return nil, fmt.Errorf("--pcrs: %q is not a PCR index 0-23", f)
		}
		pcrs = append(pcrs, n)
	}
	for _, p := range pcrs {
		if p == keys.NodeLockPCR {
			return pcrs, nil
		}
	}
	return nil, fmt.Errorf("--pcrs must include the node lock PCR %d", keys.NodeLockPCR)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// logEndorsement says how verifiers can trust the node's attestation key.
func logEndorsement(log *slog.Logger, a *tpmattester.Attester, node attestation.Attester) {
	identity, _ := a.Identity()
	if v := node.Variant(); v != attestation.VariantTPM {
		log.Info("Evidence is the vTPM's quote with the hardware report binding its key", "variant", v, "identity", identity)
		return
	}
	if a.RequestsActivation() {
		log.Info("Evidence carries the TPM's EK certificate: verifiers trusting its manufacturer (ekRoots) need no registered key", "identity", identity)
		return
	}
	log.Info("Evidence carries no EK certificate: verifiers must pin this attestation key (pinnedAKs)", "identity", identity)
}

// serveEvidence answers verifiers with the node's fresh evidence, behind
// the evidence endpoint's door (docs/continuous-attestation.md, "The
// evidence endpoint's door").
func serveEvidence(log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("serve-evidence", flag.ExitOnError)
	listen := fs.String("listen", ":9001", "address verifiers connect to")
	tpmPath := fs.String("tpm", "/dev/tpmrm0", "TPM character device or swtpm Unix socket")
	variant := fs.String("attestation", string(attestation.VariantTPM), attestationUsage)
	snpInterface := fs.String("sev-snp-interface", string(snpguest.Auto), snpInterfaceUsage)
	pcrList := fs.String("pcrs", "0,1,2,3,4,5,6,7,8,9,15", "SHA-256 PCRs to quote; must include 15")
	ekCert := fs.String("ek-certificate", string(tpmattester.EKCertificateAuto), ekCertificateUsage)
	akSource := fs.String("attestation-key", string(tpmattester.AKOwner), attestationKeyUsage)
	limits := atls.DefaultEvidenceLimits()
	clientCA := fs.String("client-ca", "/etc/kubernetes/pki/ca.crt", "the cluster CA (PEM) as this node sees it, which kubeadm writes when the node joins: "+
		"while it does not exist anyone is answered; once it does, only client certificates it issued in the groups of --allowed-groups (read again every second)")
	groups := fs.String("allowed-groups", strings.Join(atls.DefaultVerifierOrganizations(), ","),
		"comma-separated client certificate organizations answered once the node has its cluster CA: the join service's (gatehouse:verifiers) and administrators'; system:nodes is refused")
	hsRate := fs.Float64("handshake-rate", limits.Handshakes.Rate, "new connections per second allowed per source address (IPv6: per /64), before any TLS")
	hsBurst := fs.Int("handshake-burst", limits.Handshakes.Burst, "new connections a source address may open at once")
	maxSourceConns := fs.Int("max-connections-per-source", limits.PerSource, "open connections per source address at most")
	maxConns := fs.Int("max-connections", limits.Total, "open connections at most")
	hsTimeout := fs.Duration("handshake-timeout", atls.DefaultEvidenceHandshakeTimeout, "longest connection: door, quote (waiting in the queue included) and key activation")
	idleTimeout := fs.Duration("idle-timeout", atls.DefaultEvidenceIdleTimeout, "how long a connection that served evidence waits for its caller's next request (the join service keeps one per node); negative closes each after its first evidence")
	quoteQueue := fs.Int("quote-queue", atls.DefaultQuoteQueue, "quotes that may wait while one is made; a connection beyond them gets no quote and is closed")
	metricsListen := fs.String("metrics-listen", "", "HTTP address of /metrics (refusals by reason, queue length); empty serves none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pcrs, err := parsePCRs(*pcrList)
	if err != nil {
		return err
	}
	if *clientCA == "" {
		return errors.New("--client-ca must name the cluster CA file (it need not exist yet)")
	}
	if *quoteQueue < 1 {
		return fmt.Errorf("--quote-queue %d: at least 1", *quoteQueue)
	}
	if *hsTimeout <= 0 {
		return fmt.Errorf("--handshake-timeout %s must be positive", *hsTimeout)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	node, err := choose.OpenAttester(choose.AttesterOptions{
		TPMPath: *tpmPath, PCRs: pcrs, Variant: *variant, EKCertificate: *ekCert, AttestationKey: *akSource, SNPInterface: *snpInterface,
	})
	if err != nil {
		return err
	}
	defer node.Close()
	attester := node.Attester
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	if *metricsListen != "" {
		go serveMetrics(log, *metricsListen, reg)
	}
	orgs := splitList(*groups)
	if orgs == nil {
		orgs = []string{} // refused by name, not replaced by the defaults
	}
	log.Info("Serving evidence", "address", lis.Addr().String(), "clientCA", *clientCA, "allowedGroups", orgs)
	endpoint := atls.EvidenceEndpoint{
		Attester: attester, ClientCAFile: *clientCA, Organizations: orgs,
		Limits: connlimit.Limits{
			Handshakes: connlimit.Rate{Rate: *hsRate, Burst: *hsBurst}, PerSource: *maxSourceConns, Total: *maxConns,
		},
		QuoteQueue: *quoteQueue, HandshakeTimeout: *hsTimeout, IdleTimeout: *idleTimeout, Log: log, Registerer: reg,
	}
	if err := endpoint.Serve(ctx, lis); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

const ekCertificateUsage = "send the TPM's EK certificate with evidence, for verifiers trusting TPM manufacturers (ekRoots): " +
	"auto (when the TPM holds one), required, or off"

const attestationKeyUsage = "attestation key: owner (the same key on every boot; verifiers pin it or trust the TPM's EK certificate), " +
	"or gce (a Compute Engine vTPM's AK with the certificate Google issued the instance; policy gce)"

const attestationUsage = "attestation variant: tpm (the TPM's quote), sev-snp or tdx (a confidential VM: " +
	"its vTPM's quote with the AMD SEV-SNP report or Intel TDX quote binding the vTPM's key)"

const snpInterfaceUsage = "with --attestation sev-snp: the guest interface reports come through: " +
	"auto (configfs-tsm where the kernel has it, else /dev/sev-guest), configfs-tsm or sev-guest"

// kubeProxyOptions are the kube-proxy flags' settings; maxPerCore < 0 keeps
// kube-proxy's default.
func kubeProxyOptions(masqueradeAll bool, maxPerCore int) kubeadm.KubeProxyOptions {
	o := kubeadm.KubeProxyOptions{MasqueradeAll: masqueradeAll}
	if maxPerCore >= 0 {
		o.ConntrackMaxPerCore = ptr.To(int32(min(maxPerCore, math.MaxInt32)))
	}
	return o
}
