package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/azurecvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/choose"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snpguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/cloudmeta"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// options are the bootstrapper's flags, checked.
type options struct {
	logLevel string
	attester choose.AttesterOptions
	// node and kubelet are the node's kubeadm registration and kubelet.
	node    kubeadm.Node
	kubelet kubeadm.KubeletOptions
	// kubeletService restarts the kubelet.
	kubeletService bootstrapper.KubeletService
	// stateDisk is the LUKS2 state disk, opened as mapperName and mounted
	// at stateMount.
	stateDisk, mapperName, stateMount string
	// roleFromCmdline takes controlPlane from /proc/cmdline, and
	// advertiseAuto the advertise address from the default route, at start
	// (resolveFromMachine).
	roleFromCmdline, advertiseAuto bool
	// insecureStateOnRootFS keeps the state on the root file system where
	// the kernel has no device-mapper (local network-namespace clusters).
	insecureStateOnRootFS bool
	// initListen serves InitService; initSecretHashFile holds the init
	// secret's bcrypt hash.
	initListen, initSecretHashFile string
	initPort                       bootstrapper.InitPortLimits
	secretAttempts                 bootstrapper.SecretAttemptLimits
	// cloud names the instance metadata service the node asks for its
	// name, address, provider ID, join endpoints and init secret hash
	// (resolveFromMachine); "" asks none.
	cloud, cloudMetadataURL, cloudEndpointsKey, cloudInitSecretKey string
	// nodeNameSet and endpointsSet say the flags gave them, so the cloud's
	// metadata does not.
	nodeNameSet, endpointsSet bool
	// cloudProvider is the cloud's metadata once resolved.
	cloudProvider cloudmeta.Provider
	// endpoints are the join service's; nil: the node can only be
	// initialised.
	endpoints    bootstrapper.EndpointSource
	caHash       string
	controlPlane bool
	joinBackoff  bootstrapper.Backoff
	// root is the file system root components are installed into.
	root, kubeadmPath string
	// imageRepository, skipPhases, kubeProxy and controlPlaneEnv shape
	// kubeadm init.
	imageRepository string
	skipPhases      []string
	kubeProxy       kubeadm.KubeProxyOptions
	controlPlaneEnv []kubeadm.ComponentEnv

	// containerdHostsDir is containerd's config_path, where an image
	// mirror's hosts.toml files go.
	containerdHostsDir string
	// controlPlaneWait is kubeadm init's wait for the control plane.
	controlPlaneWait time.Duration
	// encryptSecrets makes a cluster this node initialises encrypt Secrets
	// in etcd (bootstrapper.InitServerConfig.EncryptSecrets).
	encryptSecrets bool
	// leaderElectionLease is the controller manager's and scheduler's
	// leader-election lease on kubeadm init.
	leaderElectionLease time.Duration
	successFile         string
	metricsListen       string
}

// parseFlags parses and checks the flags in args of the bootstrapper
// started as name; hostname is the default node name. Errors name the flag;
// -h gives flag.ErrHelp after printing the usage. The flag set is the
// bootstrapper's own: flags libraries register on the global set (such as
// go-sev-guest's -sev_guest_device_path) are unknown here.
func parseFlags(name string, args []string, hostname string) (*options, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var o options
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	nodeName := fs.String("node-name", strings.ToLower(hostname), "Kubernetes node name")
	advertise := fs.String("advertise-address", "", "this node's IP address (required; not loopback), or auto: the source address of the default route (the node image)")
	attesterOptions := attesterFlags(fs)
	fs.StringVar(&o.stateDisk, "state-disk", "", "block device of the LUKS2 state disk (required)")
	fs.StringVar(&o.mapperName, "state-disk-mapper-name", "gatehouse-state", "device-mapper name of the opened state disk")
	fs.BoolVar(&o.insecureStateOnRootFS, "insecure-state-on-root-fs", false, "where the kernel has no device-mapper, keep the node's state unencrypted on the root file system instead of refusing to bootstrap; only for a local network-namespace cluster (gatehouse mini), whose nodes share a host kernel")
	fs.StringVar(&o.stateMount, "state-disk-mount", "/run/gatehouse/state", "where the opened state disk is mounted; /etc/kubernetes, /var/lib/kubelet, /var/lib/etcd and /etc/gatehouse are bound onto it")
	fs.StringVar(&o.initListen, "init-listen", ":9000", "attested TLS address of InitService")
	fs.StringVar(&o.initSecretHashFile, "init-secret-hash-file", "/etc/gatehouse/init-secret.bcrypt", "file with the bcrypt hash of the init secret (with --cloud and no such file: the instance's metadata key --cloud-init-secret-key)")
	fs.StringVar(&o.cloud, "cloud", "", "read the node's name, address and provider ID, the join service's endpoints and the init secret's hash from the instance metadata of gce, aws (IMDSv2) or azure, or auto: whichever answers (docs/cloud.md); flags given win; empty: no cloud")
	fs.StringVar(&o.cloudMetadataURL, "cloud-metadata-url", "", "the instance metadata service's URL (http://host[:port]); empty: http://169.254.169.254")
	fs.StringVar(&o.cloudEndpointsKey, "cloud-join-endpoints-key", "gatehouse-join-endpoints", "the instance metadata key (GCE attribute, AWS or Azure tag) listing the join service's host:port endpoints, comma-separated")
	fs.StringVar(&o.cloudInitSecretKey, "cloud-init-secret-key", "gatehouse-init-secret-hash", "the instance metadata key holding the init secret's bcrypt hash")
	endpoints := fs.String("join-endpoints", "", "comma-separated join service host:port list")
	endpointsFile := fs.String("join-endpoints-file", "", "file listing join service host:port endpoints, one per line")
	fs.StringVar(&o.caHash, "cluster-ca-hash", "", "discovery token CA cert hash (sha256:<hex>) of the cluster to join")
	fs.BoolVar(&o.controlPlane, "control-plane", false, "join as a control plane")
	fs.BoolVar(&o.roleFromCmdline, "role-from-kernel-cmdline", false, "take the role from the measured kernel command line's gatehouse.role=controlPlane|worker (the node image) instead of --control-plane")
	fs.DurationVar(&o.joinBackoff.Initial, "join-backoff", bootstrapper.DefaultBackoff.Initial, "first wait between rounds of calls to the join service's endpoints; doubles each round (with jitter)")
	fs.DurationVar(&o.joinBackoff.Max, "join-backoff-max", bootstrapper.DefaultBackoff.Max, "longest wait between rounds of calls to the join service's endpoints")
	fs.StringVar(&o.root, "root", "/", "file system root to install into")
	fs.StringVar(&o.kubeadmPath, "kubeadm", "/usr/local/bin/kubeadm", "kubeadm binary (installed from the pinned components)")
	criSocket := fs.String("cri-socket", kubeadm.DefaultCRISocket, "container runtime endpoint")
	fs.StringVar(&o.kubelet.CgroupDriver, "cgroup-driver", "systemd", "kubelet cgroup driver: systemd or cgroupfs")
	fs.StringVar(&o.kubelet.CgroupRoot, "cgroup-root", "", "kubelet cgroup root (distinct per kubelet on one host)")
	fs.BoolVar(&o.kubelet.AllowCgroupV1, "allow-cgroup-v1", false, "let the kubelet run on a cgroup v1 host")
	fs.BoolVar(&o.kubelet.AllowSwap, "allow-swap", false, "let the kubelet start with swap on")
	fs.BoolVar(&o.kubelet.SharedDisk, "kubelet-shared-disk", false, "the kubelet shares the host's disk and cannot pull its images again (local cluster nodes): no image garbage collection, eviction for memory only")
	fs.BoolVar(&o.kubelet.ServingCert, "kubelet-serving-cert", true, "serve the kubelet with a cluster-CA-signed certificate and verify kubelets in the API server")
	fs.StringVar(&o.imageRepository, "image-repository", "", "control-plane image repository for kubeadm init")
	fs.StringVar(&o.containerdHostsDir, "containerd-hosts-dir", bootstrapper.DefaultContainerdHostsDir, "containerd's config_path: where the cluster's image mirror is written as <upstream>/hosts.toml (docs/install-airgapped.md)")
	pullPolicy := fs.String("image-pull-policy", "", "control-plane image pull policy: Always, IfNotPresent or Never")
	skipPhases := fs.String("skip-phases", "", "comma-separated kubeadm init phases to skip")
	fs.BoolVar(&o.kubeProxy.MasqueradeAll, "kube-proxy-masquerade-all", false, "kube-proxy SNATs all Service traffic (nodes whose pod bridge bypasses iptables)")
	proxyConntrack := fs.Int("kube-proxy-conntrack-max-per-core", -1, "kube-proxy's conntrack.maxPerCore; 0 leaves nf_conntrack_max alone (nodes in network namespaces); -1 is kube-proxy's default")
	var ignorePreflight []string
	fs.Func("ignore-preflight-errors", "comma-separated kubeadm preflight checks to ignore; repeatable, the lists add up (an image's own and a deployment's)", func(v string) error {
		ignorePreflight = append(ignorePreflight, splitList(v)...)
		return nil
	})
	kubeletService := fs.String("kubelet-service", "systemd", "how the kubelet is restarted: systemd, or none when something else supervises it")
	fs.StringVar(&o.successFile, "success-file", "", "file written once the node is bootstrapped (Cluster API: /run/cluster-api/bootstrap-success.complete)")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "HTTP address of /metrics (init refusals, refused connections); empty: none")
	l := &o.initPort.Listen
	fs.Float64Var(&l.Handshakes.Rate, "init-handshake-rate", 1, "InitService connections per second per source address (each costs a TPM quote)")
	fs.IntVar(&l.Handshakes.Burst, "init-handshake-burst", 5, "InitService connections a source address may open at once")
	fs.IntVar(&l.PerSource, "init-max-connections-per-source", 4, "open InitService connections per source address")
	fs.IntVar(&l.Total, "init-max-connections", 64, "open InitService connections in all; at the cap the oldest connection without a request in flight is closed for a new one")
	fs.DurationVar(&o.initPort.HandshakeTimeout, "init-handshake-timeout", bootstrapper.DefaultInitPortLimits.HandshakeTimeout, "longest attested TLS handshake on InitService")
	fs.DurationVar(&l.MaxIdle, "init-max-connection-idle", bootstrapper.DefaultInitPortLimits.Listen.MaxIdle, "InitService (and RecoveryService) connections without a request in flight for this long are closed")
	// The same limits bound init secrets on a new node and recovery keys
	// on a rebooted one (the port serves one door or the other).
	a := &o.secretAttempts
	a.Global.Burst = bootstrapper.DefaultSecretAttemptLimits.Global.Burst
	fs.IntVar(&a.Free, "init-secret-free-attempts", bootstrapper.DefaultSecretAttemptLimits.Free, "wrong init secrets (recovery keys on a rebooted node) a source may send before it backs off")
	fs.DurationVar(&a.Backoff, "init-secret-backoff", bootstrapper.DefaultSecretAttemptLimits.Backoff, "first wait after the free wrong init secrets; doubles with each further one")
	fs.DurationVar(&a.MaxBackoff, "init-secret-max-backoff", bootstrapper.DefaultSecretAttemptLimits.MaxBackoff, "longest wait between init secret attempts of a source")
	fs.Float64Var(&a.Global.Rate, "init-secret-rate", bootstrapper.DefaultSecretAttemptLimits.Global.Rate, "init secrets compared per second over all sources with free attempts; past it a source's next wrong secret starts its backoff")
	fs.Func("node-taints", "taints the node registers with, key[=value]:Effect separated by commas, or \""+kubeadm.NoTaints+"\" for none; unset: kubeadm's default (a control plane's control-plane taint)", func(v string) (err error) {
		o.node.Taints, err = kubeadm.ParseTaints(v)
		return err
	})
	fs.DurationVar(&o.controlPlaneWait, "control-plane-wait", 0, "how long kubeadm init waits for the control plane to be healthy and for each API call (kubeadm's timeouts controlPlaneComponentHealthCheck and kubernetesAPICall); 0: kubeadm's defaults (4m and 1m); at most 1h; for machines that start the API server slowly (a VM under emulation)")
	fs.BoolVar(&o.encryptSecrets, "encrypt-secrets", true, "on kubeadm init: the API servers encrypt Secrets in etcd with the KMS v2 plugin every control plane serves (gatehouse-bootstrapper serve-kms), its key derived from the master secret")
	fs.DurationVar(&o.leaderElectionLease, "leader-election-lease", 0, "the controller manager's and scheduler's leader-election lease on kubeadm init (renew deadline 2/3 and retry period 2/15 of it); 0: their defaults (15s); 15s to 5m; for control planes whose API server answers slowly (a VM under emulation), where a late renewal makes the leader exit")
	fs.Func("control-plane-env", "a Go memory setting of a control-plane component's static Pod on kubeadm init, component:NAME=value: component kube-apiserver, kube-controller-manager, kube-scheduler or etcd, NAME GOGC or GOMEMLIMIT (e.g. kube-apiserver:GOGC=50); repeatable; none by default", func(v string) error {
		e, err := kubeadm.ParseComponentEnv(v)
		o.controlPlaneEnv = append(o.controlPlaneEnv, e)
		return err
	})
	fs.Func("kubelet-arg", "a kubelet argument name=value (without --), e.g. node-labels=tier=web; repeatable; node labels follow NodeRestriction's rules; none by default", func(v string) error {
		arg, err := kubeadm.ParseKubeletArg(v)
		o.node.KubeletExtraArgs = append(o.node.KubeletExtraArgs, arg)
		return err
	})
	if err := fs.Parse(args); err != nil {
		return nil, err
	}

	if err := kubeadm.CheckRegistration(o.node.Taints, o.node.KubeletExtraArgs); err != nil {
		return nil, fmt.Errorf("--node-taints and --kubelet-arg: %w", err)
	}
	if err := kubeadm.CheckControlPlaneWait(o.controlPlaneWait); err != nil {
		return nil, fmt.Errorf("--control-plane-wait: %w", err)
	}
	if err := kubeadm.CheckLeaderElectionLease(o.leaderElectionLease); err != nil {
		return nil, fmt.Errorf("--leader-election-lease: %w", err)
	}
	if err := kubeadm.CheckComponentEnv(o.controlPlaneEnv); err != nil {
		return nil, fmt.Errorf("--control-plane-env: %w", err)
	}
	switch o.cloud {
	case "", "auto", "gce", "aws", "azure":
	default:
		return nil, fmt.Errorf("--cloud %q: use gce, aws, azure or auto", o.cloud)
	}
	fs.Visit(func(f *flag.Flag) {
		o.nodeNameSet = o.nodeNameSet || f.Name == "node-name"
		o.endpointsSet = o.endpointsSet || f.Name == "join-endpoints" || f.Name == "join-endpoints-file"
	})
	if (*advertise == "" && o.cloud == "") || o.stateDisk == "" {
		return nil, errors.New("--advertise-address (unless --cloud gives it) and --state-disk are required")
	}
	if o.roleFromCmdline && o.controlPlane {
		return nil, errors.New("--control-plane and --role-from-kernel-cmdline: give one; the node image takes its role from its measured kernel command line")
	}
	o.advertiseAuto = *advertise == advertiseAuto
	if o.joinBackoff.Initial <= 0 || o.joinBackoff.Max < o.joinBackoff.Initial {
		return nil, fmt.Errorf("--join-backoff %s and --join-backoff-max %s: want 0 < backoff ≤ max", o.joinBackoff.Initial, o.joinBackoff.Max)
	}
	var err error
	if o.attester, err = attesterOptions(); err != nil {
		return nil, err
	}
	switch {
	case *endpointsFile != "":
		o.endpoints = bootstrapper.FileEndpoints(*endpointsFile)
	case *endpoints != "":
		o.endpoints = bootstrapper.StaticEndpoints(strings.Split(*endpoints, ","))
	}
	switch *kubeletService {
	case "systemd":
		o.kubeletService = bootstrapper.SystemdKubelet{}
	case "none":
		o.kubeletService = bootstrapper.NoKubelet{}
	default:
		return nil, fmt.Errorf("--kubelet-service %q: use systemd or none", *kubeletService)
	}
	o.node.Name, o.node.AdvertiseAddress, o.node.CRISocket = *nodeName, *advertise, *criSocket
	o.node.ImagePullPolicy, o.node.IgnorePreflightErrors = corev1.PullPolicy(*pullPolicy), ignorePreflight
	o.skipPhases = splitList(*skipPhases)
	if *proxyConntrack >= 0 { // < 0 keeps kube-proxy's default
		o.kubeProxy.ConntrackMaxPerCore = ptr.To(int32(min(*proxyConntrack, math.MaxInt32)))
	}
	return &o, nil
}

// attesterFlags defines the flags of the node's attester on fs; the
// function returned gives them, checked, once fs is parsed.
func attesterFlags(fs *flag.FlagSet) func() (choose.AttesterOptions, error) {
	var o choose.AttesterOptions
	fs.StringVar(&o.TPMPath, "tpm", "/dev/tpmrm0", "TPM character device or swtpm Unix socket")
	fs.StringVar(&o.Variant, "attestation", string(attestation.VariantTPM), attestationUsage)
	fs.StringVar(&o.SNPInterface, "sev-snp-interface", string(snpguest.Auto), snpInterfaceUsage)
	pcrList := fs.String("pcrs", "0,1,2,3,4,5,6,7,8,9,15", "SHA-256 PCRs to quote; must include 15")
	fs.StringVar(&o.EKCertificate, "ek-certificate", string(tpmattester.EKCertificateAuto), ekCertificateUsage)
	fs.StringVar(&o.AttestationKey, "attestation-key", "", attestationKeyUsage)
	fs.StringVar(&o.AzureTHIMURL, "azure-thim-url", azurecvm.DefaultTHIMURL, "where --attestation azure-sev-snp fetches the VCEK of the chip the VM runs on (Azure's instance metadata service)")
	fs.StringVar(&o.TCGEventLog, "tcg-event-log", tpm.DefaultTCGEventLogPath, tcgEventLogUsage)
	return func() (choose.AttesterOptions, error) {
		var err error
		o.PCRs, err = parsePCRs(*pcrList)
		return o, err
	}
}

const ekCertificateUsage = "send the TPM's EK certificate with evidence, for verifiers trusting TPM manufacturers (ekRoots): " +
	"auto (when the TPM holds one), required, or off"

const attestationKeyUsage = "attestation key: owner (the same key on every boot; verifiers pin it or trust the TPM's EK certificate), " +
	"gce (a Compute Engine vTPM's AK with the certificate Google issued the instance; policy gce), " +
	"azure (the AK Azure provisions at persistent handle 0x81000003, with its certificate; policy azureTrustedLaunch), " +
	"or aws-nitro (owner's key, each evidence with the NitroTPM attestation document naming it; policy awsNitroTPM); " +
	"empty: owner, or azure for --attestation azure-sev-snp"

const tcgEventLogUsage = "the firmware's TCG event log, read afresh and sent with every evidence so verifiers replay it and " +
	"name the boot event behind a refused PCR; none when the file does not exist or with \"\" (a local cluster's swtpm nodes)"

const attestationUsage = "attestation variant: tpm (the TPM's quote), sev-snp or tdx (a confidential VM: " +
	"its vTPM's quote with the AMD SEV-SNP report or Intel TDX quote binding the vTPM's key), " +
	"or azure-sev-snp (an Azure confidential VM: its paravisor vTPM's quote with the HCL report binding the vTPM's key)"

const snpInterfaceUsage = "with --attestation sev-snp: the guest interface reports come through: " +
	"auto (configfs-tsm where the kernel has it, else /dev/sev-guest), configfs-tsm or sev-guest"

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
