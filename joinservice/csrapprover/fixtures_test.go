package csrapprover

// Test fixtures shared with joinservice/continuous's tests (a running
// machine on swtpm serving its evidence, the join config trusting it, the
// caches, a rig of Nodes): the approver's tests run the real node checker
// over real evidence.

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous/continuoustest"
)

// The fixtures shared with continuous attestation's tests (package
// continuoustest), by their short names here.
const (
	namespace         = continuoustest.Namespace
	labelControlPlane = continuoustest.LabelControlPlane
	rolePCR           = continuoustest.RolePCR
)

var (
	startRunningNode = continuoustest.StartRunningNode
	testPCRs         = continuoustest.PCRs
	bootArtefacts    = continuoustest.BootArtefacts
	joinConfig       = continuoustest.JoinConfig
	holdSilent       = continuoustest.HoldSilent
	createNode       = continuoustest.CreateNode
)

type (
	runningNode = continuoustest.RunningNode
	testWriter  = continuoustest.TestWriter
)

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
	r.log = slog.New(slog.NewJSONHandler(io.MultiWriter(testWriter{T: t}, r.logs), nil))
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
		if _, err := bindings.Bind(ctx, name, r.nodes[name].Identity(t)); err != nil {
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
