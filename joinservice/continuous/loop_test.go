package continuous

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous/continuoustest"

	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// The fixtures shared with the certificate approver's tests (package
// continuoustest), by their short names here.
const (
	namespace = continuoustest.Namespace
	rolePCR   = continuoustest.RolePCR
)

var (
	testPCRs          = continuoustest.PCRs
	bootArtefacts     = continuoustest.BootArtefacts
	startRunningNode  = continuoustest.StartRunningNode
	joinConfig        = continuoustest.JoinConfig
	joinConfigPinning = continuoustest.JoinConfigPinning
	holdSilent        = continuoustest.HoldSilent
	createNode        = continuoustest.CreateNode
)

type (
	runningNode = continuoustest.RunningNode
	testWriter  = continuoustest.TestWriter
)

// TestLoop runs rounds over real Nodes of a real API server whose
// machines serve real TPM evidence: a good worker is attested; one whose
// name another machine holds, one that answers nothing and one whose
// control-plane label its evidence does not back are not; a worker whose
// boot measurement changes (a compromised boot) is no longer attested,
// until the policy accepts the new measurement; and an unchanged outcome
// is not written again.
func TestLoop(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	clusterID := make([]byte, 32)
	if _, err := rand.Read(clusterID); err != nil {
		t.Fatal(err)
	}
	// Evidence endpoints on loopback addresses, one port for all, as on
	// real nodes.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	_ = probe.Close()
	good := startRunningNode(t, policy.RoleWorker, clusterID, "127.0.0.1", port)
	impostor := startRunningNode(t, policy.RoleWorker, clusterID, "127.0.0.2", port)
	posing := startRunningNode(t, policy.RoleWorker, clusterID, "127.0.0.3", port)
	rebooted := startRunningNode(t, policy.RoleWorker, nil, "127.0.0.4", port)
	// Another machine, rebooted (node lock not taken), answering for a
	// name bound to good: a reboot's grace is not for it.
	rebootedImpostor := startRunningNode(t, policy.RoleWorker, nil, "127.0.0.5", port)

	reg := prometheus.NewRegistry()
	var logs testkit.LogBuffer
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(testWriter{T: t}, &logs), nil))
	pol, err := joinservice.NewPolicyStore(attestation.VariantTPM, time.Now, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pol.ApplyJoinConfig(joinConfig(t, []*runningNode{good, impostor, posing, rebooted, rebootedImpostor}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := pol.ApplyDenyList(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-deny-list"},
		Data: map[string]string{joinconfig.KeyDenyList: "node:worker-denied\n"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bindings := nodebinding.New(client, namespace, time.Now)
	for node, id := range map[string]string{
		"worker-good": good.Identity(t), "worker-taken": good.Identity(t), "worker-gone": good.Identity(t),
		"cp-posing": posing.Identity(t), "worker-rebooted": rebooted.Identity(t),
		"worker-rebooted-impostor": good.Identity(t), "worker-denied": good.Identity(t),
	} {
		if _, err := bindings.Bind(ctx, node, id); err != nil {
			t.Fatal(err)
		}
	}
	for name, ip := range map[string]string{"worker-good": "127.0.0.1", "worker-taken": "127.0.0.2", "worker-gone": "127.0.0.9", "cp-posing": "127.0.0.3", "worker-rebooted": "127.0.0.4",
		"worker-rebooted-impostor": "127.0.0.5", "worker-denied": "127.0.0.1", "worker-unbound": "127.0.0.1",
	} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if strings.HasPrefix(name, "cp-") {
			n.Labels = map[string]string{labelControlPlane: ""}
		}
		created, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The caches production reads the Nodes and the bindings from.
	c := startCaches(t, client)
	nodes := c.nodes
	verifier := NewNodeChecker(pol, c.bindings, atls.FetchEvidence, func(context.Context) ([]byte, error) { return clusterID, nil }, port)
	loop := newLoop(t, client, c, verifier, log, reg, 0)
	round := func(want map[string]string) {
		t.Helper()
		waitCached(t, client, nodes)
		if _, err := loop.Round(ctx); err != nil {
			t.Fatal(err)
		}
		for node, reason := range want {
			n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := condition(n)
			if c == nil || c.Reason != reason || (c.Status == corev1.ConditionTrue) != (reason == ReasonVerified) {
				t.Errorf("%s: condition %+v, want reason %s", node, c, reason)
			}
			// One status series per node: its current reason.
			if got := statusSeries(t, reg, node); len(got) != 1 || got[reason] != 1 {
				t.Errorf("%s: gatehouse_reattest_node_status series %v, want {%s: 1}", node, got, reason)
			}
		}
	}
	first := map[string]string{
		"worker-good": ReasonVerified, "worker-taken": ReasonIdentityChanged,
		"worker-gone": ReasonUnreachable, "cp-posing": ReasonRoleNotAttested, "worker-rebooted": ReasonRebooting,
		"worker-rebooted-impostor": ReasonIdentityChanged, "worker-denied": ReasonDenied, "worker-unbound": ReasonNotBound,
	}
	round(first)
	// The default action taints a node that failed, except an unreachable
	// one within its grace period, and never the last control plane.
	tainted(t, client, map[string]bool{
		"worker-good": false, "worker-taken": true, "worker-gone": false, "cp-posing": false, "worker-rebooted": false,
		"worker-rebooted-impostor": true, "worker-denied": true, "worker-unbound": true,
	})
	// Each refusal is an audit line naming the node and the reason.
	for node, reason := range first {
		if reason == ReasonVerified {
			continue
		}
		if !strings.Contains(logs.String(), `"node":"`+node+`","attested":false,"reason":"`+reason+`"`) {
			t.Errorf("no audit line for %s with reason %s", node, reason)
		}
	}
	if got := testutil.ToFloat64(loop.metrics.actions.WithLabelValues("taint_refused")); got != 1 {
		t.Errorf("%v refusals to taint the only control plane, want 1", got)
	}
	writes := testutil.ToFloat64(loop.metrics.writes)
	if writes != 8 {
		t.Errorf("%v Node status writes in the first round, want 8", writes)
	}
	round(first)
	if got := testutil.ToFloat64(loop.metrics.writes); got != writes {
		t.Errorf("an unchanged round wrote %v Node statuses, want none", got-writes)
	}

	// A compromised boot: PCR 4 of worker-good changes.
	if err := tpm2.PCRExtend(good.RW, tpmutil.Handle(4), tpm2.AlgSHA256, bytes.Repeat([]byte{0xee}, 32), ""); err != nil {
		t.Fatal(err)
	}
	round(map[string]string{"worker-good": ReasonEvidenceRejected})
	tainted(t, client, map[string]bool{"worker-good": true})
	// The change is an Event on the Node.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=worker-good"})
		if err != nil {
			return false, nil
		}
		for _, e := range list.Items {
			if e.Reason == ReasonEvidenceRejected && e.Type == corev1.EventTypeWarning && e.Regarding.Kind == "Node" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no Warning Event %s on Node worker-good: %v", ReasonEvidenceRejected, err)
	}
	n, _ := client.CoreV1().Nodes().Get(ctx, "worker-good", metav1.GetOptions{})
	if c := condition(n); c == nil || !strings.Contains(c.Message, "4") {
		t.Errorf("the rejected node's condition does not name PCR 4: %+v", c)
	}
	// The administrator accepts the new measurement (hot reload).
	pcr4, err := tpm2.ReadPCR(good.RW, 4, tpm2.AlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	if err := pol.ApplyJoinConfig(joinConfig(t, []*runningNode{good, impostor, posing, rebooted, rebootedImpostor}, pcr4)); err != nil {
		t.Fatal(err)
	}
	round(map[string]string{"worker-good": ReasonVerified, "worker-rebooted": ReasonRebooting}) // the others' value still holds
	tainted(t, client, map[string]bool{"worker-good": false})                                   // restored automatically
	if age := testutil.ToFloat64(loop.metrics.oldestSuccessAge); age <= 0 {
		t.Errorf("oldest success age %v: the never-attested nodes count from their creation", age)
	}

	// A Node that goes loses its status series.
	if err := client.CoreV1().Nodes().Delete(ctx, "worker-gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	round(map[string]string{"worker-good": ReasonVerified})
	if got := statusSeries(t, reg, "worker-gone"); len(got) != 0 {
		t.Errorf("deleted Node worker-gone still has status series %v", got)
	}
	// A replica that stops leading (Run returns) drops every node's
	// series and reports no age: only the leader speaks for the nodes.
	runCtx, stop := context.WithCancel(ctx)
	stop()
	if err := loop.Run(runCtx); err == nil {
		t.Fatal("Run returned no error after its context ended")
	}
	if n := testutil.CollectAndCount(loop.metrics.nodeStatus); n != 0 {
		t.Errorf("%d status series left after leadership ended, want none", n)
	}
	if age := testutil.ToFloat64(loop.metrics.oldestSuccessAge); age != 0 {
		t.Errorf("oldest success age %v after leadership ended, want 0", age)
	}
}

// statusSeries returns node's gatehouse_reattest_node_status series in
// reg: their value by reason.
func statusSeries(t *testing.T, reg prometheus.Gatherer, node string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "gatehouse_reattest_node_status" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["node"] == node {
				got[labels["reason"]] = m.GetGauge().GetValue()
			}
		}
	}
	return got
}

// caches are the informers' caches production reads.
type caches struct {
	nodes    *NodeCache
	bindings *nodebinding.Cache
	records  *nodeattestation.Cache
}

// startCaches starts the caches of the Nodes, and of the bindings and the
// attestation records in namespace, and waits for their sync.
func startCaches(t testing.TB, client kubernetes.Interface) caches {
	t.Helper()
	c := caches{NewNodeCache(client), nodebinding.NewCache(client, namespace), nodeattestation.NewCache(client, namespace)}
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

// newLoop returns a loop over the caches c, writing records in namespace.
func newLoop(t testing.TB, client kubernetes.Interface, c caches, v checker, log *slog.Logger, reg prometheus.Registerer, fetchTimeout time.Duration) *Loop {
	t.Helper()
	loop, err := NewLoop(LoopConfig{Client: client, Nodes: c.nodes, Records: nodeattestation.NewStore(client, namespace), RecordCache: c.records,
		Checker: v, Events: NewEventRecorder(t.Context(), client), FetchTimeout: fetchTimeout, Log: log, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return loop
}

// waitCached waits until the cache holds every Node as the API server
// has it now: rounds run back to back here, faster than a round's own
// writes might come back through the watch.
func waitCached(t testing.TB, client kubernetes.Interface, nodes *NodeCache) {
	t.Helper()
	list, err := client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, n := range list.Items {
		want[n.Name] = n.ResourceVersion
	}
	err = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		cached, err := nodes.List()
		if err != nil || len(cached) != len(want) {
			return false, nil
		}
		for _, n := range cached {
			if want[n.Name] != n.ResourceVersion {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the Node cache did not catch up with the API server: %v", err)
	}
}

// tainted fails t unless each Node carries gate.TaintKey (NoExecute) as want says.
func tainted(t *testing.T, client kubernetes.Interface, want map[string]bool) {
	t.Helper()
	for node, w := range want {
		n, err := client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gate.TaintKey && t.Effect == corev1.TaintEffectNoExecute })
		if got != w {
			t.Errorf("%s tainted %t, want %t (taints %v)", node, got, w, n.Spec.Taints)
		}
	}
}

func condition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == ConditionType {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
