package csrapprover

// Test fixtures shared with joinservice/continuous's tests (a running
// machine on swtpm serving its evidence, the join config trusting it, the
// caches, a rig of Nodes): the approver's tests run the real node checker
// over real evidence.

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

const (
	namespace = "gatehouse-system"
	rolePCR   = 8
)

var testPCRs = []int{4, rolePCR, keys.NodeLockPCR}

// bootArtefacts are what a test node of role boots.
func bootArtefacts(role policy.Role) []tpm.Artefact {
	return []tpm.Artefact{
		tpm.BytesArtefact(4, "gatehouse-bootstrapper", []byte("bootstrapper v1")),
		tpm.BytesArtefact(rolePCR, "kernel-cmdline", []byte("gatehouse.role="+string(role))),
	}
}

// runningNode is a machine on its own swtpm that booted as role, took its
// node lock with clusterID and serves its evidence on addr.
type runningNode struct {
	attester *tpmattester.Attester
	rw       interface {
		Read([]byte) (int, error)
		Write([]byte) (int, error)
	}
	addr string
}

func startRunningNode(t *testing.T, role policy.Role, clusterID []byte, ip string, port int) *runningNode {
	t.Helper()
	rw := swtpmtest.Boot(t, t.TempDir(), bootArtefacts(role))
	if clusterID != nil { // nil: rebooted, not rejoined yet
		if err := tpm2.PCRExtend(rw, tpmutil.Handle(keys.NodeLockPCR), tpm2.AlgSHA256, clusterID, ""); err != nil {
			t.Fatal(err)
		}
	}
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = atls.ServeEvidence(t.Context(), lis, a) }()
	return &runningNode{attester: a, rw: rw, addr: lis.Addr().String()}
}

func (n *runningNode) identity(t *testing.T) string {
	t.Helper()
	id, err := n.attester.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// joinConfig is a join config trusting the nodes' keys and expecting
// what they boot, accepting pcr4 too at PCR 4 when it is set.
func joinConfig(t *testing.T, nodes []*runningNode, pcr4 []byte) *corev1.ConfigMap {
	t.Helper()
	var aks []crypto.PublicKey
	for _, n := range nodes {
		aks = append(aks, n.attester.AttestationKey())
	}
	return joinConfigPinning(t, aks, pcr4)
}

// joinConfigPinning is joinConfig trusting aks.
func joinConfigPinning(t testing.TB, aks []crypto.PublicKey, pcr4 []byte) *corev1.ConfigMap {
	t.Helper()
	ref := func(role policy.Role, pcrs ...int) map[string]any {
		r, err := tpm.ReferenceValues(bootArtefacts(role), pcrs)
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
		"variant": "tpm", "pcrs": testPCRs, "referenceValues": common, "pinnedAKs": pinned,
		"roles": map[policy.Role]any{
			policy.RoleControlPlane: map[string]any{"referenceValues": ref(policy.RoleControlPlane, rolePCR)},
			policy.RoleWorker:       map[string]any{"referenceValues": ref(policy.RoleWorker, rolePCR)},
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
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-join-config", Namespace: namespace}, Data: map[string]string{
		joinconfig.KeyAttestation: string(doc), joinconfig.KeyMeasurementSalt: strings.Repeat("cd", keys.MeasurementSaltSize),
		joinconfig.KeyAPIServerEndpoint: "10.0.0.1:6443", joinconfig.KeyKubernetesVersion: "v1.36.4",
		joinconfig.KeyKubernetesComponents: string(components),
	}}
}

type caches struct {
	nodes    *continuous.NodeCache
	bindings *nodebinding.Cache
	records  *nodeattestation.Cache
}

// startCaches starts the caches of the Nodes, and of the bindings and the
// attestation records in namespace, and waits for their sync.
func startCaches(t testing.TB, client kubernetes.Interface) caches {
	t.Helper()
	c := caches{continuous.NewNodeCache(client), nodebinding.NewCache(client, namespace), nodeattestation.NewCache(client, namespace)}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, s := range []interface {
		Start(context.Context)
		WaitForCacheSync(context.Context) error
	}{c.nodes, c.bindings, c.records} {
		s.Start(t.Context())
		if err := s.WaitForCacheSync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// labelControlPlane marks control-plane Nodes (kubeadm).
const labelControlPlane = "node-role.kubernetes.io/control-plane"

// attackRig is a real API server with Nodes whose machines serve real TPM
// evidence (or nothing), their bindings, the live policy, and the caches
// the loop and the approver read.
type attackRig struct {
	env       *testenv.Env
	client    kubernetes.Interface
	port      int
	clusterID []byte
	pol       *joinservice.PolicyStore
	caches    caches
	verifier  *continuous.NodeChecker
	log       *slog.Logger
	logs      *testkit.LogBuffer
	reg       *prometheus.Registry
	nodes     map[string]*runningNode
}

// newAttackRig starts the API server and one machine per entry of
// machines (node name → loopback IP; "" IP for none), booted as workers and
// locked; silent lists node names whose address accepts connections and
// never answers. Every machine is bound to its name and its Node exists.
func newAttackRig(t *testing.T, machines map[string]string, silent map[string]string) *attackRig {
	t.Helper()
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	r := &attackRig{env: env, client: client, clusterID: make([]byte, 32), logs: &testkit.LogBuffer{}, reg: prometheus.NewRegistry(),
		nodes: map[string]*runningNode{}}
	if _, err := rand.Read(r.clusterID); err != nil {
		t.Fatal(err)
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.port = probe.Addr().(*net.TCPAddr).Port
	_ = probe.Close()
	var running []*runningNode
	for name, ip := range machines {
		r.nodes[name] = startRunningNode(t, policy.RoleWorker, r.clusterID, ip, r.port)
		running = append(running, r.nodes[name])
	}
	r.log = slog.New(slog.NewJSONHandler(io.MultiWriter(testWriter{t}, r.logs), nil))
	if r.pol, err = joinservice.NewPolicyStore(attestation.VariantTPM, time.Now, r.log, r.reg); err != nil {
		t.Fatal(err)
	}
	if err := r.pol.ApplyJoinConfig(joinConfig(t, running, nil)); err != nil {
		t.Fatal(err)
	}
	if err := r.pol.ApplyDenyList(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-deny-list"}}); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bindings := nodebinding.New(client, namespace, time.Now)
	for name, ip := range machines {
		if _, err := bindings.Bind(ctx, name, r.nodes[name].identity(t)); err != nil {
			t.Fatal(err)
		}
		createNode(t, client, name, ip, false)
	}
	for name, ip := range silent {
		holdSilent(t, net.JoinHostPort(ip, strconv.Itoa(r.port)))
		if _, err := bindings.Bind(ctx, name, "tpm-ak:sha256:"+strings.Repeat("00", 32)); err != nil {
			t.Fatal(err)
		}
		createNode(t, client, name, ip, false)
	}
	r.caches = startCaches(t, client)
	r.verifier = continuous.NewNodeChecker(r.pol, r.caches.bindings, atls.FetchEvidence, func(context.Context) ([]byte, error) { return r.clusterID, nil }, r.port)
	return r
}

// holdSilent listens at addr and holds every connection open without a
// byte, as a node whose evidence endpoint hangs does.
func holdSilent(t testing.TB, addr string) {
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

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
