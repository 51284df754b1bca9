package kubeadm

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	kubeadmv1beta4 "sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types/upstreamv1beta4"
	"sigs.k8s.io/yaml"
)

// API versions of the generated documents (kubeadm configuration reference,
// "kubeadm Configuration (v1beta4)"; "Kubelet Configuration (v1beta1)";
// "kube-apiserver Audit Configuration (v1)").
const (
	kubeadmAPIVersion = "kubeadm.k8s.io/v1beta4"
	// defaultImageRepository is kubeadm's default imageRepository.
	defaultImageRepository = "registry.k8s.io"
	kubeletAPIVersion      = "kubelet.config.k8s.io/v1beta1"
	auditAPIVersion        = "audit.k8s.io/v1"
)

// Paths the generated configuration refers to on the node.
const (
	// AuditPolicyPath is where the audit policy (AuditPolicy) must be written.
	AuditPolicyPath = "/etc/kubernetes/audit-policy.yaml"
	// auditLogDir holds the API server's audit log.
	auditLogDir = "/var/log/kubernetes/audit"
	// KubeletPKIDir is the kubelet's certificate directory. With
	// KubeletOptions.ServingCert, its serving certificate store
	// (KubeletServingPrefix) starts with the certificate the cluster CA
	// signed at join, and the kubelet renews it through CSRs.
	KubeletPKIDir = "/var/lib/kubelet/pki"
	// KubeletServingPrefix names the kubelet's serving certificate store's
	// files: <prefix>-current.pem links to the certificate and key in PEM
	// (client-go's certificate.NewFileStore, as the kubelet opens it).
	KubeletServingPrefix = "kubelet-server"
	// KubeletKubeconfigPath is the kubelet's kubeconfig (kubeadm's
	// kubelet.conf).
	KubeletKubeconfigPath = "/etc/kubernetes/kubelet.conf"
	// PKIDir is kubeadm's certificates directory.
	PKIDir = "/etc/kubernetes/pki"
	// EncryptionConfigPath is where each control plane's API server reads
	// its EncryptionConfiguration (InitParams.EncryptSecrets); write
	// EncryptionConfiguration(KMSPluginSocket) there first.
	EncryptionConfigPath = "/etc/kubernetes/gatehouse/encryption-config.yaml"
	// kmsPluginSocketDir holds the KMS v2 plugin's Unix socket.
	kmsPluginSocketDir = "/run/gatehouse/kms"
	// KMSPluginSocket is the KMS v2 plugin's Unix socket on each control
	// plane.
	KMSPluginSocket = kmsPluginSocketDir + "/kms-v2.sock"
	// kmsProviderName names the KMS v2 provider in the
	// EncryptionConfiguration; etcd values it encrypted start with
	// "k8s:enc:kms:v2:" + kmsProviderName + ":".
	kmsProviderName = "gatehouse"
	// DefaultCRISocket is containerd's CRI endpoint.
	DefaultCRISocket = "unix:///run/containerd/containerd.sock"
	// kubeletPatchFile is the name of the kubelet patch JoinParams.Render
	// returns, to be written into JoinParams.PatchesDir (kubeadm docs,
	// "Customizing components with the kubeadm API", patches).
	kubeletPatchFile = "kubeletconfiguration+merge.yaml"
)

// TLS settings of every control-plane component and the kubelet: TLS 1.2
// or newer, and with 1.2 only AEAD suites with forward secrecy.
const tlsMinVersion = "VersionTLS12"

var tlsCipherSuites = []string{
	"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
	"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
	"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
	"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
	"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
	"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
}

// Node is the machine kubeadm runs on.
type Node struct {
	// Name is the Node name, a DNS-1123 subdomain.
	Name string
	// AdvertiseAddress is the node's IP; kubeadm refuses loopback.
	AdvertiseAddress string
	// CRISocket is the container runtime's endpoint; "" is DefaultCRISocket.
	CRISocket string
	// ImagePullPolicy of the control-plane images; "" is kubeadm's default.
	// Never suits images imported beforehand (no registry).
	ImagePullPolicy corev1.PullPolicy
	// IgnorePreflightErrors are preflight checks to ignore, e.g.
	// "SystemVerification" on cgroup v1 hosts.
	IgnorePreflightErrors []string
	// Taints are the node's registration taints: nil is kubeadm's default
	// (a control plane's node-role.kubernetes.io/control-plane:NoSchedule),
	// an empty list none (noderegistration.go).
	Taints []corev1.Taint
	// KubeletExtraArgs are kubelet arguments beside the node IP, node
	// labels among them (CheckRegistration).
	KubeletExtraArgs []KubeletArg
	// ProviderID, when set, is the Node's spec.providerID as its cloud
	// provider names the machine (e.g. gce://<project>/<zone>/<name>,
	// internal/cloudmeta), given to this node's kubelet only
	// (--provider-id in its kubeadm flags, not the cluster-wide kubelet
	// configuration every node shares).
	ProviderID string
}

func (n Node) validate() error {
	if errs := validation.IsDNS1123Subdomain(n.Name); len(errs) > 0 {
		return fmt.Errorf("node name %q: %v", n.Name, errs)
	}
	ip, err := netip.ParseAddr(n.AdvertiseAddress)
	if err != nil {
		return fmt.Errorf("advertise address %q is not an IP address", n.AdvertiseAddress)
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return fmt.Errorf("advertise address %s is loopback or unspecified; kubeadm needs the node's routable address", ip)
	}
	if err := CheckRegistration(n.Taints, n.KubeletExtraArgs); err != nil {
		return fmt.Errorf("node registration: %w", err)
	}
	if scheme, rest, ok := strings.Cut(n.ProviderID, "://"); n.ProviderID != "" && (!ok || scheme == "" || rest == "" || strings.ContainsAny(n.ProviderID, " \t\n,")) {
		return fmt.Errorf("provider ID %q is not <cloud>://<machine>", n.ProviderID)
	}
	return nil
}

func (n Node) registration() kubeadmv1beta4.NodeRegistrationOptions {
	socket := n.CRISocket
	if socket == "" {
		socket = DefaultCRISocket
	}
	// The kubelet registers with the advertised address, not whichever
	// interface has the default route.
	args := []kubeadmv1beta4.Arg{{Name: "node-ip", Value: n.AdvertiseAddress}}
	for _, a := range n.KubeletExtraArgs {
		args = append(args, kubeadmv1beta4.Arg{Name: a.Name, Value: a.Value})
	}
	if n.ProviderID != "" {
		args = append(args, kubeadmv1beta4.Arg{Name: "provider-id", Value: n.ProviderID})
	}
	return kubeadmv1beta4.NodeRegistrationOptions{
		Name:                  n.Name,
		CRISocket:             socket,
		ImagePullPolicy:       n.ImagePullPolicy,
		IgnorePreflightErrors: n.IgnorePreflightErrors,
		Taints:                n.Taints,
		KubeletExtraArgs:      args,
	}
}

// KubeletOptions adapt the kubelet to its host.
type KubeletOptions struct {
	// CgroupDriver is "systemd" (the default) or "cgroupfs" (hosts
	// without systemd, such as a local cluster's nodes).
	CgroupDriver string
	// CgroupRoot, when set, is the cgroup the kubelet puts pods under; two
	// kubelets on one host need distinct roots.
	CgroupRoot string
	// AllowCgroupV1 lets the kubelet run on a cgroup v1 host (1.35+ refuses
	// otherwise).
	AllowCgroupV1 bool
	// AllowSwap lets the kubelet start on a host with swap on.
	AllowSwap bool
	// SharedDisk is for kubelets sharing their host's disk with other
	// kubelets and the host's own work, whose images cannot be pulled again
	// (a local cluster's nodes: imported images, pull policy Never): the
	// kubelet never garbage-collects images (imageGCHighThresholdPercent
	// 100) and evicts for memory only (evictionHard memory.available, which
	// drops the nodefs and imagefs thresholds). Without it, a host disk
	// below 15 % free (another cluster's images, a build cache) made every
	// node delete its images, pause included, and evict pods.
	SharedDisk bool
	// ServingCert makes the kubelet serve with a certificate of the cluster
	// CA: it starts with the one its serving certificate store in
	// KubeletPKIDir holds (the join ticket's, or one the init node signs for
	// itself) and renews it through kubernetes.io/kubelet-serving CSRs
	// (serverTLSBootstrap), which Gatehouse approves only after fresh
	// evidence. The API server verifies kubelets against the cluster CA.
	ServingCert bool
}

func (k KubeletOptions) validate() error {
	switch k.CgroupDriver {
	case "", "systemd", "cgroupfs":
		return nil
	default:
		return fmt.Errorf("kubelet cgroup driver %q is neither systemd nor cgroupfs", k.CgroupDriver)
	}
}

// kubeletConfiguration returns the hardened kubelet configuration
// (Kubernetes docs, "Kubelet authentication/authorization", CIS
// Kubernetes Benchmark section 4.2).
func (k KubeletOptions) kubeletConfiguration() *kubeletv1beta1.KubeletConfiguration {
	driver := k.CgroupDriver
	if driver == "" {
		driver = "systemd"
	}
	c := &kubeletv1beta1.KubeletConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: kubeletAPIVersion, Kind: "KubeletConfiguration"},
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
		},
		Authorization:          kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook},
		ReadOnlyPort:           0,
		TLSMinVersion:          tlsMinVersion,
		TLSCipherSuites:        tlsCipherSuites,
		RotateCertificates:     true,
		CgroupDriver:           driver,
		CgroupRoot:             k.CgroupRoot,
		SeccompDefault:         ptr.To(true),
		MakeIPTablesUtilChains: ptr.To(true),
		EventRecordQPS:         ptr.To(int32(5)),
	}
	if k.AllowCgroupV1 {
		c.FailCgroupV1 = ptr.To(false)
	}
	if k.AllowSwap {
		c.FailSwapOn = ptr.To(false)
	}
	if k.SharedDisk {
		c.ImageGCHighThresholdPercent = ptr.To(int32(100))
		c.EvictionHard = map[string]string{"memory.available": "100Mi"}
	}
	if k.ServingCert {
		c.ServerTLSBootstrap = true
	}
	return c
}

// InitParams are what `kubeadm init` on the first control plane needs.
type InitParams struct {
	Node    Node
	Kubelet KubeletOptions
	// ClusterName is a DNS-1123 label.
	ClusterName string
	// KubernetesVersion, e.g. "v1.36.4".
	KubernetesVersion string
	// ControlPlaneEndpoint is the stable host:port of the control plane
	// (a load balancer); "" is the node's advertise address and BindPort.
	ControlPlaneEndpoint string
	// BindPort of the API server; 0 is 6443.
	BindPort int32
	// CertSANs are extra API server certificate SANs (DNS names or IPs).
	CertSANs []string
	// ServiceCIDR and PodCIDR are CIDRs, e.g. 10.96.0.0/12, 10.244.0.0/16.
	ServiceCIDR, PodCIDR string
	// ImageRepository of the control-plane images; "" is kubeadm's.
	ImageRepository string
	// SkipPhases are kubeadm init phases to skip, e.g. "addon/kube-proxy".
	SkipPhases []string
	// KubeProxy configures the kube-proxy kubeadm's addon/kube-proxy
	// phase deploys on every node.
	KubeProxy KubeProxyOptions
	// ControlPlaneEnv are the Go runtime's memory settings of the
	// control-plane components (ComponentEnv); nil keeps Go's defaults.
	ControlPlaneEnv []ComponentEnv
	// KubeletCertLifetime is the lifetime of the certificates the
	// controller manager signs (cluster-signing-duration), kubelets' client
	// and serving certificates among them; 0 is DefaultKubeletCertLifetime.
	KubeletCertLifetime time.Duration
	// ControlPlaneWait, when not zero, is how long kubeadm init waits for
	// the control plane's components to be healthy and for each of its
	// API calls to succeed (InitConfiguration timeouts
	// controlPlaneComponentHealthCheck and kubernetesAPICall, kubeadm
	// v1beta4); 0 keeps kubeadm's defaults (4 min and 1 min). A machine
	// that starts the API server slowly (a VM under emulation) needs more.
	// At most maxControlPlaneWait.
	ControlPlaneWait time.Duration
	// LeaderElectionLease, when not zero, is the leader-election lease of
	// the controller manager and the scheduler (--leader-elect-lease-duration),
	// with the renew deadline at 2/3 and the retry period at 2/15 of it
	// (their defaults, 15 s, 10 s and 2 s, in proportion). A leader whose
	// renewal misses the deadline exits, so a control plane whose API
	// server answers slowly (a VM under emulation) restarts them over and
	// over with the defaults. Between minLeaderElectionLease and
	// maxLeaderElectionLease.
	LeaderElectionLease time.Duration
	// EncryptSecrets makes the API server encrypt Secrets in etcd with
	// the KMS v2 plugin on every control plane's KMSPluginSocket, as
	// EncryptionConfiguration (written to EncryptionConfigPath first on
	// each control plane) says.
	EncryptSecrets bool
	// InitToken is the bootstrap token "<id>.<secret>" kubeadm init
	// creates (it always creates one; its bootstrap-token phase also sets up
	// the RBAC and cluster-info that joins need). It expires after
	// initTokenTTL; delete it after init, since nodes join with tokens the
	// join service issues per attested node. Secret.
	InitToken string
}

// maxControlPlaneWait bounds InitParams.ControlPlaneWait: a control plane
// not healthy after it is broken, not slow.
const maxControlPlaneWait = time.Hour

// CheckControlPlaneWait checks a ControlPlaneWait: 0 (kubeadm's defaults)
// up to maxControlPlaneWait.
func CheckControlPlaneWait(d time.Duration) error {
	if d < 0 || d > maxControlPlaneWait {
		return fmt.Errorf("control-plane wait %s is not between 0 (kubeadm's defaults) and %s", d, maxControlPlaneWait)
	}
	return nil
}

// Bounds of InitParams.LeaderElectionLease: the components' default and
// a failover slower than any emulated machine needs.
const (
	minLeaderElectionLease = 15 * time.Second
	maxLeaderElectionLease = 5 * time.Minute
)

// CheckLeaderElectionLease checks a LeaderElectionLease: 0 (the
// components' defaults) or within the bounds above.
func CheckLeaderElectionLease(d time.Duration) error {
	if d != 0 && (d < minLeaderElectionLease || d > maxLeaderElectionLease) {
		return fmt.Errorf("leader-election lease %s is neither 0 (the components' defaults) nor between %s and %s", d, minLeaderElectionLease, maxLeaderElectionLease)
	}
	return nil
}

// leaderElectionArgs are the leader-election flags of p.LeaderElectionLease,
// none when it is zero.
func (p InitParams) leaderElectionArgs() []kubeadmv1beta4.Arg {
	d := p.LeaderElectionLease
	if d == 0 {
		return nil
	}
	return []kubeadmv1beta4.Arg{
		{Name: "leader-elect-lease-duration", Value: d.String()},
		{Name: "leader-elect-renew-deadline", Value: (d * 2 / 3).String()},
		{Name: "leader-elect-retry-period", Value: (d * 2 / 15).String()},
	}
}

// KubeProxyOptions are the settings of kube-proxy's configuration
// (KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1) that differ
// from kube-proxy's defaults; the zero value keeps them all.
type KubeProxyOptions struct {
	// MasqueradeAll SNATs all traffic to Service cluster IPs (iptables
	// mode), so replies come back through the node even where bridged pod
	// traffic bypasses iptables (no br_netfilter).
	MasqueradeAll bool
	// ConntrackMaxPerCore, when set, is conntrack.maxPerCore; 0 leaves
	// nf_conntrack_max as it is, which a node in a network namespace
	// cannot change.
	ConntrackMaxPerCore *int32
}

func (k KubeProxyOptions) isZero() bool { return !k.MasqueradeAll && k.ConntrackMaxPerCore == nil }

// kubeProxyConfiguration is k as a KubeProxyConfiguration document, or nil.
func (k KubeProxyOptions) kubeProxyConfiguration() *kubeproxyv1alpha1.KubeProxyConfiguration {
	if k.isZero() {
		return nil
	}
	return &kubeproxyv1alpha1.KubeProxyConfiguration{
		TypeMeta:  metav1.TypeMeta{APIVersion: kubeproxyv1alpha1.SchemeGroupVersion.String(), Kind: "KubeProxyConfiguration"},
		IPTables:  kubeproxyv1alpha1.KubeProxyIPTablesConfiguration{MasqueradeAll: k.MasqueradeAll},
		Conntrack: kubeproxyv1alpha1.KubeProxyConntrackConfiguration{MaxPerCore: k.ConntrackMaxPerCore},
	}
}

// Bounds of InitParams.KubeletCertLifetime. Kubelets renew at 70-90 % of
// a certificate's life, so a lifetime bounds how long a node that stops
// proving itself keeps its credentials (docs/continuous-attestation.md).
const (
	DefaultKubeletCertLifetime = 24 * time.Hour
	minKubeletCertLifetime     = 2 * time.Minute
	maxKubeletCertLifetime     = 365 * 24 * time.Hour
)

// CheckKubeletCertLifetime checks that d is within the bounds above.
func CheckKubeletCertLifetime(d time.Duration) error {
	if d < minKubeletCertLifetime || d > maxKubeletCertLifetime {
		return fmt.Errorf("kubelet certificate lifetime %s is not within %s and %s", d, minKubeletCertLifetime, maxKubeletCertLifetime)
	}
	return nil
}

// kubeletCertLifetime is p.KubeletCertLifetime or the default.
func (p InitParams) kubeletCertLifetime() time.Duration {
	if p.KubeletCertLifetime == 0 {
		return DefaultKubeletCertLifetime
	}
	return p.KubeletCertLifetime
}

// initTokenTTL is the lifetime of InitParams.InitToken.
const initTokenTTL = 15 * time.Minute

func (p InitParams) validate() error {
	var errs []error
	errs = append(errs, p.Node.validate(), p.Kubelet.validate(), CheckKubeletCertLifetime(p.kubeletCertLifetime()), CheckComponentEnv(p.ControlPlaneEnv),
		CheckControlPlaneWait(p.ControlPlaneWait), CheckLeaderElectionLease(p.LeaderElectionLease))
	if msgs := validation.IsDNS1123Label(p.ClusterName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("cluster name %q: %v", p.ClusterName, msgs))
	}
	if !bootstrapTokenRE.MatchString(p.InitToken) {
		errs = append(errs, errors.New("init bootstrap token is not of the form [a-z0-9]{6}.[a-z0-9]{16}"))
	}
	if !validKubernetesVersion(p.KubernetesVersion) {
		errs = append(errs, fmt.Errorf("kubernetes version %q is not of the form v1.MINOR.PATCH", p.KubernetesVersion))
	}
	for name, cidr := range map[string]string{"service CIDR": p.ServiceCIDR, "pod CIDR": p.PodCIDR} {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q is not a CIDR such as 10.96.0.0/12", name, cidr))
		}
	}
	if p.ControlPlaneEndpoint != "" {
		if _, _, err := net.SplitHostPort(p.ControlPlaneEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("control plane endpoint %q is not host:port", p.ControlPlaneEndpoint))
		}
	}
	for _, san := range p.CertSANs {
		if net.ParseIP(san) == nil && len(validation.IsDNS1123Subdomain(san)) > 0 {
			errs = append(errs, fmt.Errorf("certificate SAN %q is neither an IP address nor a DNS name", san))
		}
	}
	return errors.Join(errs...)
}

func validKubernetesVersion(v string) bool {
	var major, minor, patch int
	n, err := fmt.Sscanf(v, "v%d.%d.%d", &major, &minor, &patch)
	return err == nil && n == 3 && major == 1 && v == fmt.Sprintf("v%d.%d.%d", major, minor, patch)
}

// Render returns the kubeadm configuration file for `kubeadm init
// --config`: InitConfiguration, ClusterConfiguration and
// KubeletConfiguration as one multi-document YAML. It hardens the control
// plane: an audit policy (write AuditPolicy to AuditPolicyPath first),
// profiling off, TLS 1.2+ with forward-secret AEAD suites, and the
// kubelet settings of KubeletOptions. Errors name each invalid parameter.
func (p InitParams) Render() ([]byte, error) {
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("kubeadm init configuration: %w", err)
	}
	port := p.BindPort
	if port == 0 {
		port = 6443
	}
	init := &kubeadmv1beta4.InitConfiguration{
		TypeMeta:         metav1.TypeMeta{APIVersion: kubeadmAPIVersion, Kind: "InitConfiguration"},
		NodeRegistration: p.Node.registration(),
		LocalAPIEndpoint: kubeadmv1beta4.APIEndpoint{AdvertiseAddress: p.Node.AdvertiseAddress, BindPort: port},
		SkipPhases:       p.SkipPhases,
	}
	if p.ControlPlaneWait > 0 {
		wait := &metav1.Duration{Duration: p.ControlPlaneWait}
		init.Timeouts = &kubeadmv1beta4.Timeouts{ControlPlaneComponentHealthCheck: wait, KubernetesAPICall: wait}
	}
	token, err := kubeadmv1beta4.NewBootstrapTokenString(p.InitToken)
	if err != nil {
		// The library's message quotes the token: do not pass it on.
		return nil, errors.New("kubeadm init configuration: init bootstrap token is malformed")
	}
	init.BootstrapTokens = []kubeadmv1beta4.BootstrapToken{{
		Token:       token,
		Description: "made by kubeadm init; deleted by the Gatehouse bootstrapper after init",
		TTL:         &metav1.Duration{Duration: initTokenTTL},
		Usages:      []string{"signing", "authentication"},
	}}
	endpoint := p.ControlPlaneEndpoint
	if endpoint == "" {
		endpoint = net.JoinHostPort(p.Node.AdvertiseAddress, strconv.Itoa(int(port)))
	}
	cluster := &kubeadmv1beta4.ClusterConfiguration{
		TypeMeta:             metav1.TypeMeta{APIVersion: kubeadmAPIVersion, Kind: "ClusterConfiguration"},
		ClusterName:          p.ClusterName,
		KubernetesVersion:    p.KubernetesVersion,
		ControlPlaneEndpoint: endpoint,
		ImageRepository:      p.ImageRepository,
		Networking:           kubeadmv1beta4.Networking{ServiceSubnet: p.ServiceCIDR, PodSubnet: p.PodCIDR},
		CertificatesDir:      PKIDir,
		EncryptionAlgorithm:  kubeadmv1beta4.EncryptionAlgorithmECDSAP256,
		APIServer: kubeadmv1beta4.APIServer{
			CertSANs:              p.CertSANs,
			ControlPlaneComponent: p.apiServer(),
		},
		ControllerManager: kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: hardenedArgs(append([]kubeadmv1beta4.Arg{
			{Name: "terminated-pod-gc-threshold", Value: "1000"},
			{Name: "cluster-signing-duration", Value: p.kubeletCertLifetime().String()},
			{Name: "controllers", Value: controllerManagerControllers},
		}, p.leaderElectionArgs()...)...)},
		Scheduler: kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: hardenedArgs(p.leaderElectionArgs()...)},
	}
	if strings.HasSuffix(p.ImageRepository, "/"+defaultImageRepository) {
		// A mirror of registry.k8s.io (<registry>/registry.k8s.io,
		// docs/install-airgapped.md) keeps CoreDNS's coredns/coredns
		// path: kubeadm adds the extra coredns/ only for its default
		// registry (kubeadm's images.GetDNSImage).
		cluster.DNS.ImageRepository = p.ImageRepository + "/coredns"
	}
	setComponentEnv(cluster, p.ControlPlaneEnv)
	docs := []any{init, cluster, p.Kubelet.kubeletConfiguration()}
	if proxy := p.KubeProxy.kubeProxyConfiguration(); proxy != nil {
		docs = append(docs, proxy)
	}
	return marshalDocs(docs...)
}

// controllerManagerControllers is the controller manager's --controllers
// in clusters Gatehouse initialises: kubeadm's own value (every default
// controller, and the bootstrap-token signer and cleaner) without
// csrapproving, which would approve kubelet client certificates through
// kubeadm's node-autoapprove ClusterRoleBindings, unattested. Only the
// join service's approver approves them (docs/continuous-attestation.md,
// "Certificates"). kubeadm keeps the ClusterConfiguration's extra
// arguments in its kubeadm-config ConfigMap, so `kubeadm upgrade` renders
// the controller manager with it again.
const controllerManagerControllers = "*,bootstrapsigner,tokencleaner,-csrapproving"

// hardenedArgs are the flags every control-plane component gets, plus extra.
func hardenedArgs(extra ...kubeadmv1beta4.Arg) []kubeadmv1beta4.Arg {
	return append([]kubeadmv1beta4.Arg{
		{Name: "profiling", Value: "false"},
		{Name: "tls-min-version", Value: tlsMinVersion},
		{Name: "tls-cipher-suites", Value: strings.Join(tlsCipherSuites, ",")},
	}, extra...)
}

func (p InitParams) apiServer() kubeadmv1beta4.ControlPlaneComponent {
	args := hardenedArgs(
		kubeadmv1beta4.Arg{Name: "audit-policy-file", Value: AuditPolicyPath},
		kubeadmv1beta4.Arg{Name: "audit-log-path", Value: auditLogDir + "/audit.log"},
		kubeadmv1beta4.Arg{Name: "audit-log-maxage", Value: "30"},
		kubeadmv1beta4.Arg{Name: "audit-log-maxbackup", Value: "10"},
		kubeadmv1beta4.Arg{Name: "audit-log-maxsize", Value: "100"},
	)
	if p.Kubelet.ServingCert {
		args = append(args, kubeadmv1beta4.Arg{Name: "kubelet-certificate-authority", Value: PKIDir + "/ca.crt"})
	}
	volumes := []kubeadmv1beta4.HostPathMount{
		{Name: "audit-policy", HostPath: AuditPolicyPath, MountPath: AuditPolicyPath, ReadOnly: true, PathType: corev1.HostPathFile},
		{Name: "audit-log", HostPath: auditLogDir, MountPath: auditLogDir, PathType: corev1.HostPathDirectoryOrCreate},
	}
	if p.EncryptSecrets {
		args = append(args, kubeadmv1beta4.Arg{Name: "encryption-provider-config", Value: EncryptionConfigPath})
		volumes = append(volumes,
			kubeadmv1beta4.HostPathMount{Name: "encryption-config", HostPath: EncryptionConfigPath, MountPath: EncryptionConfigPath, ReadOnly: true, PathType: corev1.HostPathFile},
			kubeadmv1beta4.HostPathMount{Name: "kms-plugin", HostPath: kmsPluginSocketDir, MountPath: kmsPluginSocketDir, PathType: corev1.HostPathDirectoryOrCreate})
	}
	return kubeadmv1beta4.ControlPlaneComponent{ExtraArgs: args, ExtraVolumes: volumes}
}

// EncryptionConfiguration returns the API server's encryption
// configuration (Kubernetes docs, "Encrypting Confidential Data at Rest",
// "Using a KMS provider for data encryption"): Secrets through the KMS v2
// provider kmsProviderName at socket (a path), nothing else, and no
// identity provider, so the API server neither writes nor reads a
// plaintext Secret.
func EncryptionConfiguration(socket string) ([]byte, error) {
	if !strings.HasPrefix(socket, "/") {
		return nil, fmt.Errorf("KMS plugin socket %q is not an absolute path", socket)
	}
	cfg := &apiserverv1.EncryptionConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "apiserver.config.k8s.io/v1", Kind: "EncryptionConfiguration"},
		Resources: []apiserverv1.ResourceConfiguration{{
			Resources: []string{"secrets"},
			Providers: []apiserverv1.ProviderConfiguration{{KMS: &apiserverv1.KMSConfiguration{
				APIVersion: "v2", Name: kmsProviderName, Endpoint: "unix://" + socket,
				Timeout: &metav1.Duration{Duration: 3 * time.Second},
			}}},
		}},
	}
	return marshalDocs(cfg)
}

// JoinParams are what `kubeadm join` needs, from a join ticket.
type JoinParams struct {
	Node    Node
	Kubelet KubeletOptions
	// APIServerEndpoint is host:port of the API server.
	APIServerEndpoint string
	// Token is the bootstrap token, "<id>.<secret>". Secret.
	Token string
	// CACertHash is the discovery token CA cert hash, "sha256:<hex>".
	CACertHash string
	// ControlPlane makes the node a control plane; the cluster PKI must be
	// in PKIDir beforehand (manual certificate distribution).
	ControlPlane bool
	// BindPort of a control plane's API server; 0 is 6443.
	BindPort int32
	// PatchesDir is where the caller writes the returned patches.
	PatchesDir string
	// SkipPhases are kubeadm join phases to skip.
	SkipPhases []string
}

func (p JoinParams) validate() error {
	var errs []error
	errs = append(errs, p.Node.validate(), p.Kubelet.validate())
	if _, _, err := net.SplitHostPort(p.APIServerEndpoint); err != nil {
		errs = append(errs, fmt.Errorf("API server endpoint %q is not host:port", p.APIServerEndpoint))
	}
	if !bootstrapTokenRE.MatchString(p.Token) {
		errs = append(errs, errors.New("bootstrap token is not of the form [a-z0-9]{6}.[a-z0-9]{16}"))
	}
	if !caCertHashRE.MatchString(p.CACertHash) {
		errs = append(errs, fmt.Errorf("discovery token CA cert hash %q is not sha256: and 64 hex digits", p.CACertHash))
	}
	if p.PatchesDir == "" {
		errs = append(errs, errors.New("patches directory is not set"))
	}
	return errors.Join(errs...)
}

// Render returns the kubeadm configuration file for `kubeadm join
// --config` (JoinConfiguration with token discovery pinned to the CA cert
// hash) and the patches to write into PatchesDir (file name → content),
// which carry the hardened KubeletConfiguration: kubeadm join takes the
// cluster's kubelet configuration and applies these on top. The output
// holds the bootstrap token: write it with mode 0600 and never log it.
func (p JoinParams) Render() (config []byte, patches map[string][]byte, err error) {
	if err := p.validate(); err != nil {
		return nil, nil, fmt.Errorf("kubeadm join configuration: %w", err)
	}
	join := &kubeadmv1beta4.JoinConfiguration{
		TypeMeta:         metav1.TypeMeta{APIVersion: kubeadmAPIVersion, Kind: "JoinConfiguration"},
		NodeRegistration: p.Node.registration(),
		CACertPath:       PKIDir + "/ca.crt",
		Discovery: kubeadmv1beta4.Discovery{
			BootstrapToken: &kubeadmv1beta4.BootstrapTokenDiscovery{
				Token:             p.Token,
				APIServerEndpoint: p.APIServerEndpoint,
				CACertHashes:      []string{p.CACertHash},
			},
			TLSBootstrapToken: p.Token,
		},
		Patches:    &kubeadmv1beta4.Patches{Directory: p.PatchesDir},
		SkipPhases: p.SkipPhases,
		Timeouts:   &kubeadmv1beta4.Timeouts{KubernetesAPICall: &metav1.Duration{Duration: time.Minute}},
	}
	if p.ControlPlane {
		port := p.BindPort
		if port == 0 {
			port = 6443
		}
		join.ControlPlane = &kubeadmv1beta4.JoinControlPlane{
			LocalAPIEndpoint: kubeadmv1beta4.APIEndpoint{AdvertiseAddress: p.Node.AdvertiseAddress, BindPort: port},
		}
	}
	config, err = marshalDocs(join)
	if err != nil {
		return nil, nil, err
	}
	kubelet := p.Kubelet.kubeletConfiguration()
	kubelet.TypeMeta = metav1.TypeMeta{}
	patch, err := yaml.Marshal(kubelet)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the kubelet patch: %w", err)
	}
	// The cluster's kubelet configuration is the init node's: its cgroup
	// root (a local cluster's namespace node has one of its own) must not
	// reach a node that has none, which an omitted field would let through.
	var fields map[string]any
	if err := yaml.Unmarshal(patch, &fields); err != nil {
		return nil, nil, fmt.Errorf("encoding the kubelet patch: %w", err)
	}
	fields["cgroupRoot"] = p.Kubelet.CgroupRoot
	if patch, err = yaml.Marshal(fields); err != nil {
		return nil, nil, fmt.Errorf("encoding the kubelet patch: %w", err)
	}
	return config, map[string][]byte{kubeletPatchFile: patch}, nil
}

// AuditPolicy returns the API server's audit policy (Kubernetes docs,
// "Auditing"): Secrets, ConfigMaps and token reviews only at Metadata level
// so their contents never reach the log; no logging of read-only health
// and discovery endpoints or of the high-volume node/lease updates;
// everything else at Metadata, and changes at RequestResponse.
func AuditPolicy() ([]byte, error) {
	p := &auditv1.Policy{
		TypeMeta:          metav1.TypeMeta{APIVersion: auditAPIVersion, Kind: "Policy"},
		OmitStages:        []auditv1.Stage{auditv1.StageRequestReceived},
		OmitManagedFields: true,
		Rules: []auditv1.PolicyRule{
			{Level: auditv1.LevelNone, NonResourceURLs: []string{"/healthz*", "/livez*", "/readyz*", "/version", "/metrics", "/openapi*", "/api", "/apis"}},
			{Level: auditv1.LevelNone, Verbs: []string{"get", "update"}, Resources: []auditv1.GroupResources{{Group: "coordination.k8s.io", Resources: []string{"leases"}}}},
			{Level: auditv1.LevelNone, Users: []string{"system:kube-proxy"}, Verbs: []string{"watch"}},
			{Level: auditv1.LevelMetadata, Resources: []auditv1.GroupResources{
				{Group: "", Resources: []string{"secrets", "configmaps", "serviceaccounts/token"}},
				{Group: "authentication.k8s.io", Resources: []string{"tokenreviews"}},
				{Group: "certificates.k8s.io", Resources: []string{"certificatesigningrequests"}},
			}},
			{Level: auditv1.LevelMetadata, Verbs: []string{"get", "list", "watch"}},
			{Level: auditv1.LevelRequestResponse},
		},
	}
	return marshalDocs(p)
}

// marshalDocs encodes objects as one multi-document YAML stream.
func marshalDocs(objs ...any) ([]byte, error) {
	var out bytes.Buffer
	for i, o := range objs {
		data, err := yaml.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("encoding kubeadm configuration: %w", err)
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(data)
	}
	return out.Bytes(), nil
}
