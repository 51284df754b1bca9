package mini

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
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

	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/cli/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

func randRead(b []byte) (int, error) { return rand.Read(b) }

// writeClusterConfig writes the cluster configuration: reference values
// of what an untampered node measures, and the nodes' attestation keys.
func writeClusterConfig(path string, opts Options, manifest []byte, aks [][]byte) error {
	artefacts, err := BootArtefacts(filepath.Join(opts.BinDir, "gatehouse-bootstrapper"), manifest)
	if err != nil {
		return err
	}
	ref, err := tpm.ReferenceValues(artefacts, []int{4})
	if err != nil {
		return err
	}
	refYAML, err := ref.Marshal()
	if err != nil {
		return err
	}
	refJSON, err := yaml.YAMLToJSON(refYAML)
	if err != nil {
		return err
	}
	var pinned []string
	for _, ak := range aks {
		pinned = append(pinned, string(ak))
	}
	data, err := clusterconfig.Generate(clusterconfig.TemplateValues{
		Name: "mini", KubernetesVersion: opts.KubernetesVersion, ReferenceValues: string(refJSON),
		PCRs: PCRs, PinnedAKs: pinned, ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
	})
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644) //nolint:gosec // reference values and public keys
}

// services is the control plane's Gatehouse services and an admin client.
type services struct {
	client  kubernetes.Interface
	cp      *NodeSpec
	dir     string
	caHash  string
	version string
}

// Names of the join service's policy ConfigMaps in kube-system.
const (
	joinConfigName  = "gatehouse-join-config"
	denyListName    = "gatehouse-deny-list"
	joinServiceUser = "gatehouse-joinservice"
)

// deployServices runs the key service and the join service as static Pods
// on the control plane (host network), with their credentials, RBAC and an
// empty deny list.
func deployServices(ctx context.Context, opts Options, cp *NodeSpec, kubeconfig string) (*services, error) {
	s, err := servicesFromKubeconfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	root := cp.rootDir()
	ca, err := clusterpki.LoadCA(filepath.Join(root, "etc/kubernetes/pki/ca.crt"), filepath.Join(root, "etc/kubernetes/pki/ca.key"))
	if err != nil {
		return nil, err
	}
	s.cp, s.dir, s.caHash, s.version = cp, opts.Dir, ca.DiscoveryTokenCACertHash(), opts.KubernetesVersion
	internal := filepath.Join(root, "etc/gatehouse/internal")
	if err := writeInternalPKI(internal); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := ca.SignClient(joinServiceUser, nil, time.Now())
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate().Raw})
	kc := clientcmdapi.NewConfig()
	kc.Clusters["mini"] = &clientcmdapi.Cluster{Server: fmt.Sprintf("https://%s:6443", cp.IP), CertificateAuthorityData: caPEM}
	kc.AuthInfos[joinServiceUser] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kc.Contexts["mini"] = &clientcmdapi.Context{Cluster: "mini", AuthInfo: joinServiceUser}
	kc.CurrentContext = "mini"
	if err := clientcmd.WriteToFile(*kc, filepath.Join(root, "etc/gatehouse/joinservice.conf")); err != nil {
		return nil, err
	}
	if err := s.applyRBAC(ctx); err != nil {
		return nil, err
	}
	if err := s.putConfigMap(ctx, denyListName, map[string]string{joinconfig.KeyDenyList: ""}); err != nil {
		return nil, err
	}
	for name, pod := range map[string]*corev1.Pod{
		"gatehouse-keyservice": staticPod("gatehouse-keyservice", []string{
			"gatehouse-keyservice", "--listen", "127.0.0.1:9100", "--metrics-listen", "127.0.0.1:9101",
			"--tls-cert", "/etc/gatehouse/internal/keyservice.crt", "--tls-key", "/etc/gatehouse/internal/keyservice.key",
			"--client-ca", "/etc/gatehouse/internal/ca.crt", "--kms-uri-file", "/etc/kubernetes/gatehouse/kms-uri",
		}, []string{"/etc/gatehouse", "/etc/kubernetes/gatehouse"}),
		"gatehouse-joinservice": staticPod("gatehouse-joinservice", []string{
			"gatehouse-joinservice", "--listen", fmt.Sprintf("%s:%d", cp.IP, JoinPort), "--http-listen", "127.0.0.1:9091",
			"--kubeconfig", "/etc/gatehouse/joinservice.conf", "--pki-dir", "/etc/kubernetes/pki",
			"--keyservice-endpoint", "127.0.0.1:9100", "--keyservice-ca", "/etc/gatehouse/internal/ca.crt",
			"--keyservice-cert", "/etc/gatehouse/internal/joinservice.crt", "--keyservice-key", "/etc/gatehouse/internal/joinservice.key",
			"--rate-limit", "5", "--rate-burst", "20",
		}, []string{"/etc/gatehouse", "/etc/kubernetes/pki"}),
	} {
		data, err := yaml.Marshal(pod)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(root, "etc/kubernetes/manifests", name+".yaml"), data, 0o600); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// staticPod is a host-network Pod running the locally built image of
// name with command, mounting hostPaths read-only.
func staticPod(name string, command, hostPaths []string) *corev1.Pod {
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceSystem, Labels: map[string]string{"app.kubernetes.io/name": name}},
		Spec: corev1.PodSpec{
			HostNetwork:       true,
			PriorityClassName: "system-node-critical",
			Containers: []corev1.Container{{
				Name: name, Image: serviceImage(name), ImagePullPolicy: corev1.PullNever, Command: command,
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true)},
			}},
		},
	}
	for i, p := range hostPaths {
		v := fmt.Sprintf("host-%d", i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v, MountPath: p, ReadOnly: true})
	}
	return pod
}

// applyRBAC lets the join service user do exactly its job.
func (s *services) applyRBAC(ctx context.Context) error {
	rbac := s.client.RbacV1()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "gatehouse:joinservice", Namespace: metav1.NamespaceSystem},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "get", "update"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "update"}},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "gatehouse:joinservice", Namespace: metav1.NamespaceSystem},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "gatehouse:joinservice"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: joinServiceUser}},
	}
	clusterRole := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "gatehouse:joinservice"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}},
	}
	clusterBinding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "gatehouse:joinservice"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "gatehouse:joinservice"},
		Subjects:   binding.Subjects,
	}
	for _, create := range []func() error{
		func() error {
			_, err := rbac.Roles(metav1.NamespaceSystem).Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := rbac.RoleBindings(metav1.NamespaceSystem).Create(ctx, binding, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := rbac.ClusterRoles().Create(ctx, clusterRole, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := rbac.ClusterRoleBindings().Create(ctx, clusterBinding, metav1.CreateOptions{})
			return err
		},
	} {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the join service's RBAC: %w", err)
		}
	}
	return nil
}

func (s *services) putConfigMap(ctx context.Context, name string, data map[string]string) error {
	cms := s.client.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceSystem}, Data: data}
	_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("writing ConfigMap %s: %w", name, err)
	}
	return nil
}

// publishPolicy writes the join config: the cluster configuration's
// attestation policy, the measurement salt, the API server endpoint, the
// version and the components nodes install.
func (s *services) publishPolicy(ctx context.Context, configPath string, components []*componentsv1.Component) error {
	cfg, err := clusterconfig.Load(configPath)
	if err != nil {
		return err
	}
	policy, err := yaml.Marshal(cfg.Attestation)
	if err != nil {
		return err
	}
	var state struct {
		MeasurementSalt string `json:"measurementSalt"`
	}
	data, err := os.ReadFile(filepath.Join(s.dir, "gatehouse-state.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &state); err != nil {
		return err
	}
	if _, err := hex.DecodeString(state.MeasurementSalt); err != nil {
		return fmt.Errorf("state file: measurement salt: %w", err)
	}
	var list []json.RawMessage
	for _, c := range components {
		b, err := protojson.Marshal(c)
		if err != nil {
			return err
		}
		list = append(list, b)
	}
	comps, err := json.Marshal(list)
	if err != nil {
		return err
	}
	return s.putConfigMap(ctx, joinConfigName, map[string]string{
		joinconfig.KeyAttestation:          string(policy),
		joinconfig.KeyMeasurementSalt:      state.MeasurementSalt,
		joinconfig.KeyAPIServerEndpoint:    net.JoinHostPort(s.cp.IP, "6443"),
		joinconfig.KeyKubernetesVersion:    s.version,
		joinconfig.KeyKubernetesComponents: string(comps),
	})
}

// waitReady polls until every node but the tampered ones is Ready.
func (s *services) waitReady(ctx context.Context, workers []*NodeSpec, tampered []string, p *progress) error {
	want := []string{s.cp.Name}
	for _, w := range workers {
		if !slices.Contains(tampered, w.Name) {
			want = append(want, w.Name)
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	reported := map[string]bool{}
	for {
		nodes, err := s.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		ready := 0
		if err == nil {
			for _, n := range nodes.Items {
				if slices.Contains(want, n.Name) && nodeReady(&n) {
					ready++
					if !reported[n.Name] {
						reported[n.Name] = true
						p.step("Node %s is Ready", n.Name)
					}
				}
			}
		}
		if ready == len(want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d nodes Ready after 5 minutes (see %s/nodes/*/logs)", ready, len(want), s.dir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
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
