// Package continuoustest holds the fixtures the tests of continuous
// attestation and of the certificate approver share: machines on swtpm
// that booted, took their node lock and serve their evidence, the join
// config trusting them, their Nodes, and a node that never answers.
package continuoustest

import (
	"crypto"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// Namespace is where the tests keep bindings and records; RolePCR holds
// a test node's role.
const (
	Namespace = "gatehouse-system"
	RolePCR   = 8
)

// LabelControlPlane marks control-plane Nodes (kubeadm).
const LabelControlPlane = "node-role.kubernetes.io/control-plane"

// PCRs are the PCRs a test node quotes.
var PCRs = []int{4, RolePCR, keys.NodeLockPCR}

// BootArtefacts are what a test node of role boots.
func BootArtefacts(role policy.Role) []tpm.Artefact {
	return []tpm.Artefact{
		tpm.BytesArtefact(4, "gatehouse-bootstrapper", []byte("bootstrapper v1")),
		tpm.BytesArtefact(RolePCR, "kernel-cmdline", []byte("gatehouse.role="+string(role))),
	}
}

// RunningNode is a machine on its own swtpm that booted as role, took its
// node lock with clusterID and serves its evidence on Addr.
type RunningNode struct {
	Attester *tpmattester.QuoteAttester
	RW       interface {
		Read([]byte) (int, error)
		Write([]byte) (int, error)
	}
	Addr string
}

// StartRunningNode boots a machine as role on its own swtpm, extends
// clusterID into its node-lock PCR (nil: not yet) and serves its evidence
// on ip:port until the test ends.
func StartRunningNode(t *testing.T, role policy.Role, clusterID []byte, ip string, port int) *RunningNode {
	t.Helper()
	rw := swtpmtest.Boot(t, t.TempDir(), BootArtefacts(role))
	if clusterID != nil { // nil: rebooted, not rejoined yet
		if err := tpm2.PCRExtend(rw, tpmutil.Handle(keys.NodeLockPCR), tpm2.AlgSHA256, clusterID, ""); err != nil {
			t.Fatal(err)
		}
	}
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: PCRs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = atls.ServeEvidence(t.Context(), lis, a) }()
	return &RunningNode{Attester: a, RW: rw, Addr: lis.Addr().String()}
}

// Identity is the machine's attestation identity.
func (n *RunningNode) Identity(t *testing.T) string {
	t.Helper()
	id, err := n.Attester.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// JoinConfig is a join config trusting the nodes' keys and expecting
// what they boot, accepting pcr4 too at PCR 4 when it is set.
func JoinConfig(t *testing.T, nodes []*RunningNode, pcr4 []byte) *corev1.ConfigMap {
	t.Helper()
	var aks []crypto.PublicKey
	for _, n := range nodes {
		aks = append(aks, n.Attester.AttestationKey())
	}
	return JoinConfigPinning(t, aks, pcr4)
}

// JoinConfigPinning is JoinConfig trusting aks.
func JoinConfigPinning(t testing.TB, aks []crypto.PublicKey, pcr4 []byte) *corev1.ConfigMap {
	t.Helper()
	ref := func(role policy.Role, pcrs ...int) map[string]any {
		r, err := tpm.ReferenceValues(BootArtefacts(role), pcrs)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]any{}
		for i, m := range r {
			out[fmt.Sprint(i)] = map[string]any{"expected": hex.EncodeToString(m.Expected)}
		}
		return out
	}
	common := ref(policy.RoleWorker, 4)
	if pcr4 != nil { // accepted besides what the others measure
		common["4"].(map[string]any)["alsoAccepted"] = []string{hex.EncodeToString(pcr4)}
	}
	var pinned []string
	for _, ak := range aks {
		spki, err := x509.MarshalPKIXPublicKey(ak)
		if err != nil {
			t.Fatal(err)
		}
		pinned = append(pinned, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki})))
	}
	doc, err := yaml.Marshal(map[string]any{
		"variant": "tpm", "pcrs": PCRs, "referenceValues": common, "pinnedAKs": pinned,
		"roles": map[policy.Role]any{
			policy.RoleControlPlane: map[string]any{"referenceValues": ref(policy.RoleControlPlane, RolePCR)},
			policy.RoleWorker:       map[string]any{"referenceValues": ref(policy.RoleWorker, RolePCR)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	components, err := json.Marshal([]map[string]any{{
		"url": "https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", "hash": "sha256:" + strings.Repeat("ab", 32),
		"installPath": "/usr/local/bin/kubelet",
	}})
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-join-config", Namespace: Namespace}, Data: map[string]string{
		joinconfig.KeyAttestation: string(doc), joinconfig.KeyMeasurementSalt: strings.Repeat("cd", keys.MeasurementSaltSize),
		joinconfig.KeyAPIServerEndpoint: "10.0.0.1:6443", joinconfig.KeyKubernetesVersion: "v1.36.4",
		joinconfig.KeyKubernetesComponents: string(components),
	}}
}

// HoldSilent listens at addr and holds every connection open without a
// byte, as a node whose evidence endpoint hangs does.
func HoldSilent(t testing.TB, addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
}

// CreateNode creates Node name with InternalIP ip, labelled a control
// plane when cp is set.
func CreateNode(t *testing.T, client kubernetes.Interface, name, ip string, cp bool) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if cp {
		n.Labels = map[string]string{LabelControlPlane: ""}
	}
	created, err := client.CoreV1().Nodes().Create(t.Context(), n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(t.Context(), created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestWriter sends log lines to t.Log.
type TestWriter struct{ T *testing.T }

func (w TestWriter) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
