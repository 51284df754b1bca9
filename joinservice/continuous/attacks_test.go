package continuous

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice"
)

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
	verifier  *NodeChecker
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
	r.verifier = NewNodeChecker(r.pol, r.caches.bindings, atls.FetchEvidence, func(context.Context) ([]byte, error) { return r.clusterID, nil }, r.port)
	return r
}

// compromise extends PCR 4 of node's TPM, as a compromised boot component
// would.
func (r *attackRig) compromise(t *testing.T, node string) {
	t.Helper()
	if err := tpm2.PCRExtend(r.nodes[node].RW, tpmutil.Handle(4), tpm2.AlgSHA256, bytes.Repeat([]byte{0xee}, 32), ""); err != nil {
		t.Fatal(err)
	}
}

// forge patches node's own condition to Attested=True/Verified with the
// node's kubelet credentials (NodeRestriction lets a node patch its own
// status).
func forge(ctx context.Context, asNode kubernetes.Interface, node string) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: ConditionType, Status: corev1.ConditionTrue, Reason: ReasonVerified, Message: "all good, says the node",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}}})
	if err != nil {
		return err
	}
	_, err = asNode.CoreV1().Nodes().PatchStatus(ctx, node, patch)
	return err
}

// TestTaintCannotBeDodged is the attack of a compromised node with its own
// kubelet credentials: it re-patches its own Attested condition as fast as
// it can, which made every taint write of a round conflict (the taint was
// written with the resourceVersion the round started with), and it writes
// itself Attested=True/Verified. The node is still tainted within two
// rounds; its forged condition is written back from the authoritative
// record at once (the watch, not the next round); the record, which the
// node cannot write, keeps the verdict; and a taint the node removes comes
// back.
func TestTaintCannotBeDodged(t *testing.T) {
	r := newAttackRig(t, map[string]string{"worker-good": "127.0.0.1", "worker-bad": "127.0.0.2"}, nil)
	ctx := t.Context()
	loop := newLoop(t, r.client, r.caches, r.verifier, r.log, r.reg, 0)
	r.compromise(t, "worker-bad")
	kubelet := asNode(t, r.env.Config, "worker-bad")
	if err := forge(ctx, kubelet, "worker-bad"); err != nil {
		t.Fatalf("the node cannot patch its own status, so this test proves nothing: %v", err)
	}
	forgeCtx, stopForging := context.WithCancel(ctx)
	forged := make(chan int, 1)
	go func() {
		n := 0
		for forgeCtx.Err() == nil {
			if forge(forgeCtx, kubelet, "worker-bad") == nil {
				n++
			}
		}
		forged <- n
	}()
	for round := 1; ; round++ {
		if _, err := loop.Round(ctx); err != nil {
			t.Fatal(err)
		}
		n, err := r.client.CoreV1().Nodes().Get(ctx, "worker-bad", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if hasTaint(n) {
			break
		}
		if round == 2 {
			stopForging()
			t.Fatalf("a node re-patching its own condition (%d patches) is not tainted after two rounds", <-forged)
		}
	}
	stopForging()
	t.Logf("the node patched its own condition %d times during the rounds", <-forged)
	rec, err := nodeattestation.NewStore(r.client, namespace).Get(ctx, "worker-bad")
	if err != nil || rec.Attested || rec.Reason != ReasonEvidenceRejected || !rec.Tainted {
		t.Fatalf("record %+v (%v), want EvidenceRejected, tainted", rec, err)
	}

	// Between rounds: the mirror watches.
	stop, err := loop.startMirror(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := forge(ctx, kubelet, "worker-bad"); err != nil {
		t.Fatal(err)
	}
	untaint, err := json.Marshal(map[string]any{"spec": map[string]any{"taints": []corev1.Taint{}}})
	if err != nil {
		t.Fatal(err)
	}
	// Without NodeRestriction a node may write its own taints; with it
	// (kubeadm enables it) this is refused. Either way the taint holds.
	_, _ = kubelet.CoreV1().Nodes().Patch(ctx, "worker-bad", types.MergePatchType, untaint, metav1.PatchOptions{})
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := r.client.CoreV1().Nodes().Get(ctx, "worker-bad", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := condition(n)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == ReasonEvidenceRejected && hasTaint(n), nil
	})
	if err != nil {
		t.Fatalf("the forged condition or removed taint was not written back from the record: %v", err)
	}
	if got := testutil.ToFloat64(loop.metrics.reasserted.WithLabelValues("condition")); got < 1 {
		t.Errorf("%v condition write-backs counted, want at least 1", got)
	}
	if !strings.Contains(r.logs.String(), `"event":"reattest.reassert","node":"worker-bad"`) {
		t.Error("no audit line for the write-back")
	}
	// The honest node is untouched.
	n, err := r.client.CoreV1().Nodes().Get(ctx, "worker-good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := condition(n); c == nil || c.Reason != ReasonVerified || hasTaint(n) {
		t.Errorf("worker-good: condition %+v, taints %v", c, n.Spec.Taints)
	}
}

// TestSilentNodeDelaysNoOne: a node whose evidence endpoint accepts and
// never answers held every write of the round until its fetch gave up
// (no write happened before every check ended). Now a compromised node is
// tainted while the silent node's check is still under way, well within
// the per-node deadline.
func TestSilentNodeDelaysNoOne(t *testing.T) {
	r := newAttackRig(t, map[string]string{"worker-bad": "127.0.0.2"}, map[string]string{"worker-silent": "127.0.0.6"})
	ctx := t.Context()
	const deadline = 10 * time.Second
	loop := newLoop(t, r.client, r.caches, r.verifier, r.log, r.reg, deadline)
	r.compromise(t, "worker-bad")
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := loop.Round(ctx)
		done <- err
	}()
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 2*deadline, true, func(ctx context.Context) (bool, error) {
		n, err := r.client.CoreV1().Nodes().Get(ctx, "worker-bad", metav1.GetOptions{})
		return err == nil && hasTaint(n), nil
	})
	tainted := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if tainted > deadline/2 {
		t.Errorf("the compromised node was tainted %v after the round began: the silent node (deadline %v) held it", tainted, deadline)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*deadline {
		t.Errorf("the round took %v, more than twice the per-node deadline %v", took, deadline)
	}
	rec, err := nodeattestation.NewStore(r.client, namespace).Get(ctx, "worker-silent")
	if err != nil || rec.Reason != ReasonUnreachable {
		t.Errorf("worker-silent: record %+v (%v), want Unreachable", rec, err)
	}
}

// TestSilentNodesHaveTheirOwnPool: nodes that did not answer last round
// are checked apart. With two checks at a time and four nodes silent since
// the last round, a shared pool would hold the compromised node's check
// behind two whole deadlines; it is tainted within half of one.
func TestSilentNodesHaveTheirOwnPool(t *testing.T) {
	silent := map[string]string{}
	for i := range 4 {
		silent["worker-silent-"+strconv.Itoa(i)] = "127.0.0." + strconv.Itoa(10+i)
	}
	r := newAttackRig(t, map[string]string{"worker-bad": "127.0.0.2"}, silent)
	ctx := t.Context()
	const deadline = 6 * time.Second
	loop, err := NewLoop(LoopConfig{Client: r.client, Nodes: r.caches.nodes, Records: nodeattestation.NewStore(r.client, namespace),
		RecordCache: r.caches.records, Checker: r.verifier, Events: NewEventRecorder(ctx, r.client), FetchTimeout: deadline,
		Concurrency: 2, Log: r.log, Registerer: r.reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loop.Round(ctx); err != nil { // the silent nodes are seen silent once
		t.Fatal(err)
	}
	r.compromise(t, "worker-bad")
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := loop.Round(ctx)
		done <- err
	}()
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 4*deadline, true, func(ctx context.Context) (bool, error) {
		n, err := r.client.CoreV1().Nodes().Get(ctx, "worker-bad", metav1.GetOptions{})
		return err == nil && hasTaint(n), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > deadline/2 {
		t.Errorf("the compromised node was tainted %v after the round began, behind the silent nodes (deadline %v)", took, deadline)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// asNode returns a client authenticated as node's kubelet (impersonated
// by the test's administrator).
func asNode(t *testing.T, cfg *rest.Config, node string) kubernetes.Interface {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node, Groups: []string{"system:nodes", "system:authenticated"}}
	client, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return client
}
