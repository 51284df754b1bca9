package kubeadm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

const (
	testToken = "abcdef.0123456789abcdef"
	testHash  = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
)

func kubeadmBin(t *testing.T) string {
	t.Helper()
	dir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "kubeadm")
}

func initParams(addr string) kubeadm.InitParams {
	return kubeadm.InitParams{
		Node:              kubeadm.Node{Name: "cp-0", AdvertiseAddress: addr},
		ClusterName:       "gatehouse",
		KubernetesVersion: "v1.36.4",
		ServiceCIDR:       "10.96.0.0/12",
		PodCIDR:           "10.244.0.0/16",
		CertSANs:          []string{"gatehouse.example", "203.0.113.7"},
		InitToken:         "abcdef.0123456789abcdef",
	}
}

// miniInit is a local cluster's control plane: no systemd, cgroup v1,
// images imported beforehand, a kubelet serving certificate from the CA.
func miniInit(addr string) kubeadm.InitParams {
	p := initParams(addr)
	p.Node.ImagePullPolicy = corev1.PullNever
	p.Node.IgnorePreflightErrors = []string{"SystemVerification"}
	p.Kubelet = kubeadm.KubeletOptions{CgroupDriver: "cgroupfs", CgroupRoot: "/cp-0", AllowCgroupV1: true, AllowSwap: true, SharedDisk: true, ServingCert: true}
	p.ImageRepository = "docker.io/local"
	p.KubeProxy = kubeadm.KubeProxyOptions{MasqueradeAll: true, ConntrackMaxPerCore: ptr.To(int32(0))}
	p.ControlPlaneEnv = []kubeadm.ComponentEnv{{Component: "kube-apiserver", Name: "GOGC", Value: "50"}, {Component: "etcd", Name: "GOGC", Value: "50"}}
	return p
}

func joinParams(t *testing.T, addr string, controlPlane bool) kubeadm.JoinParams {
	return kubeadm.JoinParams{
		Node:              kubeadm.Node{Name: "worker-1", AdvertiseAddress: addr},
		Kubelet:           kubeadm.KubeletOptions{CgroupDriver: "cgroupfs", CgroupRoot: "/w1", ServingCert: true},
		APIServerEndpoint: "10.0.0.1:6443",
		Token:             testToken,
		CACertHash:        testHash,
		ControlPlane:      controlPlane,
		PatchesDir:        t.TempDir(),
	}
}

// writeJoin renders p into dir: the config file and its patches.
func writeJoin(t *testing.T, p kubeadm.JoinParams) string {
	t.Helper()
	config, patches, err := p.Render()
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range patches {
		if err := os.WriteFile(filepath.Join(p.PatchesDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "join.yaml")
	if err := os.WriteFile(path, config, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func writeInit(t *testing.T, p kubeadm.InitParams) string {
	t.Helper()
	config, err := p.Render()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "init.yaml")
	if err := os.WriteFile(path, config, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConfigsPassKubeadmValidate runs the real `kubeadm config validate`
// on every generated configuration.
func TestConfigsPassKubeadmValidate(t *testing.T) {
	addr := testenv.HostAddress(t)
	bin := kubeadmBin(t)
	files := map[string]string{
		"init":               writeInit(t, initParams(addr)),
		"init local cluster": writeInit(t, miniInit(addr)),
		"init, slow machine": writeInit(t, slowInit(addr)),
		"init, Secrets encrypted": writeInit(t, func() kubeadm.InitParams {
			p := initParams(addr)
			p.EncryptSecrets = true
			return p
		}()),
		"join worker":        writeJoin(t, joinParams(t, addr, false)),
		"join control plane": writeJoin(t, joinParams(t, addr, true)),
		"join worker on a cloud": writeJoin(t, func() kubeadm.JoinParams {
			p := joinParams(t, addr, false)
			p.Node.ProviderID = "aws:///eu-west-1a/i-0123456789abcdef0"
			return p
		}()),
	}
	policy, err := kubeadm.AuditPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(policy), "kind: Policy") {
		t.Fatalf("audit policy:\n%s", policy)
	}
	// The provider ID is this node's kubelet flag, not the shared kubelet
	// configuration.
	if data, _ := os.ReadFile(files["join worker on a cloud"]); !strings.Contains(string(data), "name: provider-id\n    value: aws:///eu-west-1a/i-0123456789abcdef0") {
		t.Errorf("the join configuration does not give the kubelet its provider ID:\n%s", data)
	}
	for name, path := range files {
		t.Run(name, func(t *testing.T) {
			out, err := exec.CommandContext(t.Context(), bin, "config", "validate", "--config", path).CombinedOutput()
			if err != nil {
				data, _ := os.ReadFile(path)
				t.Fatalf("kubeadm config validate: %v\n%s\nconfig:\n%s", err, out, data)
			}
		})
	}
}

// TestInitDryRun runs the real `kubeadm init --dry-run` with the local
// cluster's configuration and checks the hardening reached the manifests
// and the add-ons their configuration.
func TestInitDryRun(t *testing.T) {
	testenv.RequireRoot(t)
	p := miniInit(testenv.HostAddress(t))
	// This machine runs no container runtime: every preflight check may fail.
	p.Node.IgnorePreflightErrors = []string{"all"}
	out, err := testenv.RunIsolated(t.Context(), t.TempDir(), kubeadmBin(t), "init", "--dry-run", "--config", writeInit(t, p))
	if err != nil {
		t.Fatalf("kubeadm init --dry-run: %v\n%s", err, out)
	}
	for _, want := range []string{
		"--profiling=false", "--audit-policy-file=" + kubeadm.AuditPolicyPath, "--tls-min-version=VersionTLS12",
		"--kubelet-certificate-authority=/etc/kubernetes/pki/ca.crt", "image: docker.io/local/kube-apiserver:v1.36.4",
		"failCgroupV1: false", "cgroupRoot: /cp-0", "serverTLSBootstrap: true",
		// A shared disk: no image garbage collection, eviction for memory only.
		"imageGCHighThresholdPercent: 100", "memory.available: 100Mi", "--cluster-signing-duration=24h0m0s",
		// The add-ons, with the kube-proxy settings of a node in a network namespace.
		"image: docker.io/local/kube-proxy:v1.36.4", "image: docker.io/local/coredns:v1.14.2", "masqueradeAll: true", "maxPerCore: 0",
		// The Go memory settings of a local cluster's control plane, in the static Pods.
		"name: GOGC",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubeadm init --dry-run output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// TestJoinDryRunDiscovery: the real `kubeadm join --dry-run` with a
// generated JoinConfiguration discovers the test environment's cluster with
// a bootstrap token and the CA cert hash, as a node holding a join ticket.
func TestJoinDryRunDiscovery(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{ControllerManager: true})
	ctx := t.Context()
	if err := env.PublishClusterInfo(ctx); err != nil {
		t.Fatal(err)
	}
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	token, err := testenv.CreateBootstrapToken(ctx, client, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := strings.Cut(token, ".")
	if err := testenv.WaitClusterInfoSigned(ctx, client, id); err != nil {
		t.Fatal(err)
	}
	hash, err := kubeadm.DiscoveryTokenCACertHashPEM(env.CACertPEM)
	if err != nil {
		t.Fatal(err)
	}
	p := joinParams(t, testenv.HostAddress(t), false)
	p.Node.IgnorePreflightErrors = []string{"all"}
	p.APIServerEndpoint = strings.TrimPrefix(env.APIServerURL, "https://")
	p.Token, p.CACertHash = token, hash
	out, err := testenv.RunIsolated(ctx, t.TempDir(), kubeadmBin(t), "join", "--dry-run", "--config", writeJoin(t, p), "--v", "1")
	if err != nil {
		t.Fatalf("kubeadm join --dry-run: %v\n%s", err, out)
	}
	if want := "Cluster info signature and contents are valid and TLS certificate validates against pinned roots"; !strings.Contains(string(out), want) {
		t.Fatalf("kubeadm output lacks %q:\n%s", want, out)
	}

	// A wrong CA hash is refused by kubeadm's discovery.
	p.CACertHash = testHash
	out, err = testenv.RunIsolated(ctx, t.TempDir(), kubeadmBin(t), "join", "--dry-run", "--config", writeJoin(t, p))
	if err == nil || !strings.Contains(string(out), "none of the public keys") {
		t.Fatalf("kubeadm join with a wrong CA hash: %v\n%s", err, out)
	}
}

func TestRenderRejectsBadInput(t *testing.T) {
	addr := "192.0.2.10"
	for _, tc := range []struct {
		name   string
		mutate func(*kubeadm.InitParams)
		want   string
	}{
		{"loopback address", func(p *kubeadm.InitParams) { p.Node.AdvertiseAddress = "127.0.0.1" }, "loopback"},
		{"no address", func(p *kubeadm.InitParams) { p.Node.AdvertiseAddress = "" }, "not an IP"},
		{"node name", func(p *kubeadm.InitParams) { p.Node.Name = "Node_1" }, "node name"},
		{"cluster name", func(p *kubeadm.InitParams) { p.ClusterName = "a.b" }, "cluster name"},
		{"version", func(p *kubeadm.InitParams) { p.KubernetesVersion = "1.36" }, "v1.MINOR.PATCH"},
		{"service CIDR", func(p *kubeadm.InitParams) { p.ServiceCIDR = "10.96.0.0" }, "service CIDR"},
		{"SAN", func(p *kubeadm.InitParams) { p.CertSANs = []string{"not a name"} }, "SAN"},
		{"cgroup driver", func(p *kubeadm.InitParams) { p.Kubelet.CgroupDriver = "none" }, "cgroup driver"},
		{"init token", func(p *kubeadm.InitParams) { p.InitToken = "" }, "init bootstrap token"},
		{"kubelet certificate lifetime", func(p *kubeadm.InitParams) { p.KubeletCertLifetime = time.Minute }, "kubelet certificate lifetime 1m0s"},
		{"control-plane wait", func(p *kubeadm.InitParams) { p.ControlPlaneWait = 2 * time.Hour }, "control-plane wait 2h0m0s is not between 0"},
		{"leader-election lease", func(p *kubeadm.InitParams) { p.LeaderElectionLease = 5 * time.Second }, "leader-election lease 5s is neither 0"},
		{"provider ID", func(p *kubeadm.InitParams) { p.Node.ProviderID = "i-0123" }, `provider ID "i-0123" is not <cloud>://<machine>`},
	} {
		p := initParams(addr)
		tc.mutate(&p)
		if _, err := p.Render(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	secret := "abcdef.0123456789ABCDEF"
	p := joinParams(t, addr, false)
	p.Token = secret
	_, _, err := p.Render()
	if err == nil || !strings.Contains(err.Error(), "bootstrap token") || strings.Contains(err.Error(), secret) {
		t.Errorf("bad token: %v (must name the field, not the token)", err)
	}
}

// slowInit is initParams for a machine that starts the API server slowly.
func slowInit(addr string) kubeadm.InitParams {
	p := initParams(addr)
	p.ControlPlaneWait = 15 * time.Minute
	p.LeaderElectionLease = time.Minute
	return p
}

// TestControlPlaneWait: a control-plane wait reaches kubeadm's init
// timeouts (kubeadm config validate accepts them: TestConfigsPassKubeadmValidate);
// none keeps kubeadm's defaults.
func TestControlPlaneWait(t *testing.T) {
	out, err := slowInit("192.0.2.10").Render()
	if err != nil {
		t.Fatal(err)
	}
	if want := "timeouts:\n  controlPlaneComponentHealthCheck: 15m0s\n  kubernetesAPICall: 15m0s\n"; !strings.Contains(string(out), want) {
		t.Errorf("the init configuration lacks %q:\n%s", want, out)
	}
	out, err = initParams("192.0.2.10").Render()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "timeouts:") {
		t.Errorf("without a wait the init configuration sets timeouts:\n%s", out)
	}
	if strings.Contains(string(out), "leader-elect") {
		t.Errorf("without a lease the init configuration sets leader election:\n%s", out)
	}
}

// TestLeaderElectionLease: a lease reaches the controller manager's and
// the scheduler's flags, with the renew deadline and retry period in the
// defaults' proportion (kubeadm config validate accepts them:
// TestConfigsPassKubeadmValidate).
func TestLeaderElectionLease(t *testing.T) {
	out, err := slowInit("192.0.2.10").Render()
	if err != nil {
		t.Fatal(err)
	}
	args := "- name: leader-elect-lease-duration\n    value: 1m0s\n  - name: leader-elect-renew-deadline\n    value: 40s\n  - name: leader-elect-retry-period\n    value: 8s\n"
	if n := strings.Count(string(out), args); n != 2 {
		t.Errorf("the leader-election flags appear %d times, want 2 (controller manager, scheduler):\n%s", n, out)
	}
}

// TestJoinPatchSetsTheCgroupRoot: the kubelet patch of a join always names
// the node's cgroup root, the root cgroup ("") included, so the cluster's
// kubelet configuration (the init node's, which may have a root of its own)
// never gives a joining node another node's.
func TestJoinPatchSetsTheCgroupRoot(t *testing.T) {
	for _, root := range []string{"/w1", ""} {
		p := joinParams(t, "10.0.0.11", false)
		p.Kubelet = kubeadm.KubeletOptions{CgroupRoot: root}
		_, patches, err := p.Render()
		if err != nil {
			t.Fatal(err)
		}
		for _, patch := range patches {
			var fields map[string]any
			if err := yaml.Unmarshal(patch, &fields); err != nil {
				t.Fatal(err)
			}
			if got, ok := fields["cgroupRoot"]; !ok || got != root {
				t.Errorf("cgroup root %q: the patch sets cgroupRoot %v (present: %t):\n%s", root, got, ok, patch)
			}
		}
	}
}
