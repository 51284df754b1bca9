package mini

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	componentlist "github.com/gatehouse-dev/gatehouse/internal/components"
	"github.com/gatehouse-dev/gatehouse/internal/helm"
)

func randRead(b []byte) (int, error) { return rand.Read(b) }

// writeClusterConfig writes the cluster configuration: reference values
// of what an untampered node measures (PCR 4) and of each role (rolePCR),
// and the TPM manufacturer CA whose TPMs are trusted.
func writeClusterConfig(path string, opts Options, manifest []byte, tpmCA swtpm.LocalCA, controlPlaneEndpoint string) error {
	bin := filepath.Join(opts.BinDir, "gatehouse-bootstrapper")
	var common string
	roles := map[policy.Role]string{}
	for _, role := range []policy.Role{policy.RoleControlPlane, policy.RoleWorker} {
		artefacts, err := BootArtefacts(bin, manifest, role)
		if err != nil {
			return err
		}
		if common, err = referenceValuesJSON(artefacts, 4); err != nil {
			return err
		}
		if roles[role], err = referenceValuesJSON(artefacts, rolePCR); err != nil {
			return err
		}
	}
	root, intermediate, err := tpmCA.Roots()
	if err != nil {
		return err
	}
	tv := clusterconfig.TemplateValues{
		Name: "mini", KubernetesVersion: opts.KubernetesVersion, ReferenceValues: common, RoleReferenceValues: roles,
		PCRs: PCRs, EKRoots: string(root), EKIntermediates: string(intermediate), ServiceCIDR: serviceCIDR, PodCIDR: "10.244.0.0/16",
		ControlPlaneEndpoint: controlPlaneEndpoint, KubeletCertLifetime: opts.KubeletCertLifetime,
		// The nodes download from the cluster's mirror (mirror.go).
		Mirror: opts.clusterMirror(),
	}
	if opts.NodeImage != "" {
		if err := acceptVMNodes(context.Background(), &tv, opts.NodeImage); err != nil {
			return err
		}
	}
	data, err := clusterconfig.Generate(tv)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644) //nolint:gosec // reference values and public keys
}

// referenceValuesJSON returns the values artefacts leave in pcr, as the
// JSON of package measurements' format.
func referenceValuesJSON(artefacts []tpm.Artefact, pcr int) (string, error) {
	ref, err := tpm.ReferenceValues(artefacts, []int{pcr})
	if err != nil {
		return "", err
	}
	refYAML, err := ref.Marshal()
	if err != nil {
		return "", err
	}
	refJSON, err := yaml.YAMLToJSON(refYAML)
	return string(refJSON), err
}

// services is the control planes' Gatehouse services and an admin client.
type services struct {
	client     kubernetes.Interface
	kubeconfig string
	cp         *NodeSpec // the first control plane
	apiServer  string    // host:port of the API servers (controlPlaneEndpoint)
	dir        string
	caHash     string
	version    string
	// vms: some nodes are VMs, which boot, pull images and start pods in
	// minutes under TCG emulation (docs/benchmarks.md, "VM nodes").
	vms bool
}

// vmWait bounds the waits for nodes and add-ons in a cluster with VM
// nodes: a VM control plane's kube-proxy and CoreDNS ran 7 min after its
// kubeadm init under TCG on an idle machine.
const vmWait = 20 * time.Minute

// wait is how long to wait for what takes d in a cluster of namespace
// nodes.
func (s *services) wait(d time.Duration) time.Duration {
	if s.vms {
		return max(d, vmWait)
	}
	return d
}

// deployServices installs the key service and the join service from the
// embedded Helm charts with the locally built images (imported into every
// namespace node, pulled from the cluster's registry by VMs), their TLS Secrets, and a join config trusting the
// local TPM manufacturer's CA. One of each runs on every control plane's
// host network (DaemonSets): the join service reaches the key service of
// its own node on 127.0.0.1, and the API servers at apiServer (the
// controlPlaneEndpoint), with no Service addresses on the way.
func deployServices(ctx context.Context, opts Options, cp *NodeSpec, kubeconfig, configPath, apiServer string, components []*componentsv1.Component, caHash string) (*services, error) {
	s, err := servicesFromKubeconfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	s.cp, s.apiServer, s.dir, s.caHash, s.version, s.kubeconfig = cp, apiServer, opts.Dir, caHash, opts.KubernetesVersion, kubeconfig
	s.vms = opts.Provider == ProviderQEMU || opts.VMWorkers > 0
	apiHost, apiPort, err := net.SplitHostPort(apiServer)
	if err != nil {
		return nil, err
	}
	pkiDir := filepath.Join(opts.Dir, "internal-pki")
	if err := writeInternalPKI(pkiDir); err != nil {
		return nil, err
	}
	// The key service's URI is the one init gave the first control plane,
	// made from the master secret init wrote beside the cluster (a VM
	// node's files are not on the host).
	secret, err := clusterconfig.ReadMasterSecret(filepath.Join(opts.Dir, clusterconfig.DefaultMasterSecretFile))
	if err != nil {
		return nil, err
	}
	kmsURI := []byte(secret.KeyServiceURI())
	read := func(name string) []byte {
		data, rerr := os.ReadFile(filepath.Join(pkiDir, name))
		if rerr != nil && err == nil {
			err = rerr
		}
		return data
	}
	secrets := map[string]map[string][]byte{
		"gatehouse-kms":                        {"kms-uri": kmsURI},
		"gatehouse-keyservice-tls":             {"tls.crt": read("keyservice.crt"), "tls.key": read("keyservice.key"), "ca.crt": read("ca.crt")},
		"gatehouse-joinservice-keyservice-tls": {"tls.crt": read("joinservice.crt"), "tls.key": read("joinservice.key"), "ca.crt": read("ca.crt")},
	}
	if err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: charts.Namespace}}
	if _, err := s.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", charts.Namespace, err)
	}
	for name, data := range secrets {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: charts.Namespace}, Data: data}
		if _, err := s.client.CoreV1().Secrets(charts.Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating Secret %s: %w", name, err)
		}
	}
	joinConfig, lifetime, err := s.joinConfigValues(configPath, components)
	if err != nil {
		return nil, err
	}
	// A namespace node has the images imported, never pulled; a VM control
	// plane pulls them from the cluster's registry (pushImages).
	pullPolicy := "Never"
	if opts.Provider == ProviderQEMU {
		pullPolicy = "IfNotPresent"
	}
	releases := []struct {
		name   string
		values map[string]any
	}{
		{"gatehouse-keyservice", map[string]any{
			"image": map[string]any{"pullPolicy": pullPolicy},
			"kind":  "DaemonSet", "hostNetwork": true, "listenHost": "127.0.0.1",
			"service": map[string]any{"port": 9100}, "metricsPort": 9101,
		}},
		{"gatehouse-joinservice", map[string]any{
			"image":                 map[string]any{"pullPolicy": pullPolicy},
			"keyService":            map[string]any{"endpoint": "127.0.0.1:9100"},
			"kubernetesServiceHost": apiHost, "kubernetesServicePort": apiPort,
			"port":      joinPort,
			"rateLimit": map[string]any{"rate": 5, "burst": 20},
			// A local cluster shows a node's attestation state quickly.
			"reattest":            map[string]any{"interval": "10s"},
			"kubeletCertLifetime": lifetime.String(),
			"joinConfig":          joinConfig,
		}},
	}
	cfg, err := helm.Config(kubeconfig, charts.Namespace)
	if err != nil {
		return nil, err
	}
	registry := cp.Network.RegistryAddress()
	if err := opts.Release.push(ctx, registry); err != nil {
		return nil, err
	}
	for _, r := range releases {
		c, err := opts.Release.chart(r.name, r.values, registry)
		if err != nil {
			return nil, err
		}
		install := action.NewInstall(cfg)
		// Helm's wait would add nothing: it counts a DaemonSet ready once
		// its pods are scheduled (maxUnavailable 1 of 1), and the joining
		// nodes retry until a join service answers.
		install.ReleaseName, install.Namespace = r.name, charts.Namespace
		install.Timeout = 3 * time.Minute
		values, err := mirrorChartValues(opts, c, r.name, r.values)
		if err != nil {
			return nil, err
		}
		if _, err := install.RunWithContext(ctx, c, values); err != nil {
			return nil, fmt.Errorf("installing the %s chart: %w", r.name, err)
		}
	}
	return s, nil
}

// joinConfigValues are the join service chart's joinConfig values: the
// cluster configuration's attestation policy, the measurement salt, the
// API server endpoint, the version and the components nodes install; and
// the cluster's kubelet certificate lifetime.
func (s *services) joinConfigValues(configPath string, components []*componentsv1.Component) (map[string]any, time.Duration, error) {
	cfg, err := clusterconfig.Load(configPath)
	if err != nil {
		return nil, 0, err
	}
	policy, err := yaml.Marshal(cfg.Attestation)
	if err != nil {
		return nil, 0, err
	}
	state, err := clusterconfig.ReadState(filepath.Join(s.dir, clusterconfig.DefaultStateFile))
	if err != nil {
		return nil, 0, err
	}
	if _, err := hex.DecodeString(state.MeasurementSalt); err != nil {
		return nil, 0, fmt.Errorf("state file: measurement salt: %w", err)
	}
	comps, err := componentlist.MarshalList(components)
	if err != nil {
		return nil, 0, err
	}
	return map[string]any{
		"attestation":          string(policy),
		"measurementSalt":      state.MeasurementSalt,
		"apiServerEndpoint":    s.apiServer,
		"kubernetesVersion":    s.version,
		"kubernetesComponents": comps,
	}, cfg.KubeletCertLifetime(), nil
}

// waitReady waits until the control plane and workers are Ready.
func (s *services) waitReady(ctx context.Context, workers []*NodeSpec, p *progress) error {
	want := []string{s.cp.Name}
	for _, w := range workers {
		want = append(want, w.Name)
	}
	reported := map[string]bool{}
	ready := 0
	err := poll(ctx, 250*time.Millisecond, s.wait(5*time.Minute), "every node to be Ready", func() (bool, error) {
		nodes, err := s.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // the API server may be restarting: keep polling
		}
		ready = 0
		for _, n := range nodes.Items {
			if slices.Contains(want, n.Name) && nodeReady(&n) {
				ready++
				if !reported[n.Name] {
					reported[n.Name] = true
					p.step("Node %s is Ready", n.Name)
				}
			}
		}
		return ready == len(want), nil
	})
	if err != nil {
		return fmt.Errorf("%d of %d nodes Ready (see %s/nodes/*/logs): %w", ready, len(want), s.dir, err)
	}
	return nil
}

// waitAddons waits until kube-proxy runs on all nodes nodes and CoreDNS is
// available: then Services and cluster DNS work.
func (s *services) waitAddons(ctx context.Context, nodes int) error {
	state := ""
	err := poll(ctx, 250*time.Millisecond, s.wait(3*time.Minute), "kube-proxy and CoreDNS", func() (bool, error) {
		proxy, err := s.client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err != nil {
			state = err.Error()
			return false, nil
		}
		dns, err := s.client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			state = err.Error()
			return false, nil
		}
		state = fmt.Sprintf("kube-proxy ready on %d of %d nodes, CoreDNS %d of %d replicas available",
			proxy.Status.NumberReady, nodes, dns.Status.AvailableReplicas, ptr.Deref(dns.Spec.Replicas, 1))
		return int(proxy.Status.NumberReady) == nodes && dns.Status.AvailableReplicas == ptr.Deref(dns.Spec.Replicas, 1), nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", state, err)
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// printNodes prints a `kubectl get nodes`-style table.
func (s *services) printNodes(ctx context.Context, out io.Writer) error {
	nodes, err := s.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(w, "NAME\tSTATUS\tROLES\tAGE\tVERSION\tINTERNAL-IP")
	for _, n := range nodes.Items {
		status := "NotReady"
		if nodeReady(&n) {
			status = "Ready"
		}
		var roles []string
		for l := range n.Labels {
			if r, ok := strings.CutPrefix(l, "node-role.kubernetes.io/"); ok {
				roles = append(roles, r)
			}
		}
		role := "<none>"
		if len(roles) > 0 {
			role = strings.Join(roles, ",")
		}
		ip := ""
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, status, role,
			time.Since(n.CreationTimestamp.Time).Round(time.Second), n.Status.NodeInfo.KubeletVersion, ip)
	}
	return w.Flush()
}

// writeInternalPKI writes the CA of Gatehouse's internal services and the
// key service's server and the join service's client certificates.
func writeInternalPKI(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gatehouse-internal-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePEMFile(filepath.Join(dir, "ca.crt"), "CERTIFICATE", caDER); err != nil {
		return err
	}
	for i, leaf := range []struct {
		name string
		eku  x509.ExtKeyUsage
	}{{"keyservice", x509.ExtKeyUsageServerAuth}, {"joinservice", x509.ExtKeyUsageClientAuth}} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: "gatehouse-" + leaf.name},
			DNSNames: []string{"gatehouse-" + leaf.name, "localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{leaf.eku},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEMFile(filepath.Join(dir, leaf.name+".crt"), "CERTIFICATE", der); err != nil {
			return err
		}
		if err := writePEMFile(filepath.Join(dir, leaf.name+".key"), "PRIVATE KEY", keyDER); err != nil {
			return err
		}
	}
	return nil
}

func writePEMFile(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func servicesFromKubeconfig(kubeconfig string) (*services, error) {
	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	return &services{client: client}, nil
}
