package continuous

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/joinservice"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// envBenchNodes sets BenchmarkReattest's number of nodes (default 500).
const envBenchNodes = "GATEHOUSE_BENCH_REATTEST_NODES"

// benchHeartbeat is the loop's heartbeat here: longer than the first round
// of 10,000 nodes takes (over 7 minutes at the client's 50 writes/s), so
// that no heartbeat falls due in the steady rounds that follow it. The
// heartbeat round moves the clock past it; the figures with heartbeats
// amortise its cost over production's defaultHeartbeat.
const benchHeartbeat = time.Hour

// BenchmarkReattest measures what continuous attestation costs the server
// side at scale. n simulated nodes (GATEHOUSE_BENCH_REATTEST_NODES, 500 by
// default), each a Node of a real API server with its own loopback
// address 127.3.x.y as InternalIP and a binding to its machine's
// identity, serve real TPM evidence at the evidence port from rig
// processes of their own (see serveRig; one per 4,000 nodes): each one
// simulated TPM, whose AK its nodes attest with and their bindings name,
// pinned by the policy among n AKs as in a cluster of n nodes with pinned
// keys. The loop runs in this process as in the join service: Nodes and
// bindings from informers' caches, evidence fetched through the nodes'
// doors with the join service's fetcher (kept connections, resumed
// sessions), the client's rate limits the join service's defaults (50/s,
// burst 100).
//
// It measures, as server CPU (this process, kube-apiserver and etcd,
// from getrusage and /proc) per re-verification:
//   - the first round, which writes every Node's condition and an Event;
//   - the steady rounds (each b.Loop iteration is one round), which must
//     write nothing;
//   - a round after the heartbeat is due, which rewrites every condition:
//     amortised over Heartbeat/DefaultInterval rounds, the steady cost
//     with the heartbeat's writes included;
//
// and beside them, in the same process, the plain verification of one
// node's evidence (policy.Appraisal.Verify, the appraisal the loop uses),
// with the ratio; the steady rounds' p50 and p99 Check latency per node,
// and the rig's CPU per re-verification. Run it with bench/reattest.sh.
func BenchmarkReattest(b *testing.B) {
	n := 500
	if s := os.Getenv(envBenchNodes); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 || n > 250*256 {
			b.Fatalf("%s=%q: want 1 to %d nodes", envBenchNodes, s, 250*256)
		}
	}
	ctx := b.Context()
	env := testenv.New(b, testenv.Options{})
	adminCfg := rest.CopyConfig(env.Config)
	adminCfg.QPS, adminCfg.Burst = 1000, 2000 // setup and checks, out of the way
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		b.Fatal(err)
	}
	loopCfg := rest.CopyConfig(env.Config)
	loopCfg.QPS, loopCfg.Burst = 50, 100 // gatehouse-joinservice's --kube-api-qps and --kube-api-burst
	client, err := kubernetes.NewForConfig(loopCfg)
	if err != nil {
		b.Fatal(err)
	}
	clusterID, nonce := make([]byte, 32), make([]byte, attestation.NonceSize)
	for _, p := range [][]byte{clusterID, nonce} {
		if _, err := rand.Read(p); err != nil {
			b.Fatal(err)
		}
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	_ = probe.Close()
	caFile := filepath.Join(env.Dir, "pki", "ca.crt")
	r := startRigs(b, rigSetup{Nodes: n, Port: port, ClusterID: clusterID, Nonce: nonce, ClientCAFile: caFile})
	ca, err := clusterpki.LoadCA(caFile, filepath.Join(env.Dir, "pki", "ca.key"))
	if err != nil {
		b.Fatal(err)
	}
	// The join service's fetch: its own verifier certificate through the
	// nodes' door.
	fetch := atls.EvidenceFetcher{
		Certificate: clusterpki.NewVerifierIdentity(ca, time.Now).Certificate,
		Sessions:    tls.NewLRUClientSessionCache(atls.DefaultEvidenceSessions),
		Conns:       atls.NewEvidenceConns(atls.DefaultEvidenceSessions),
	}.Fetch

	log := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	pol, err := joinservice.NewPolicyStore(attestation.VariantTPM, time.Now, log, reg)
	if err != nil {
		b.Fatal(err)
	}
	// The policy pins n AKs, as a cluster of n nodes with pinned keys
	// would: n-len(r) others, and the rigs' in the middle, where a node's
	// key is on average.
	var aks []crypto.PublicKey
	for range n - len(r) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			b.Fatal(err)
		}
		aks = append(aks, k.Public())
	}
	for _, rr := range r {
		aks = slices.Insert(aks, len(aks)/2, rr.ak)
	}
	if err := pol.ApplyJoinConfig(joinConfigPinning(b, aks, nil)); err != nil {
		b.Fatal(err)
	}
	if err := pol.ApplyDenyList(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-deny-list"},
		Data: map[string]string{joinconfig.KeyDenyList: ""}}); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	nodeBytes := createNodes(b, admin, n, func(i int) string { return r.of(i).Identity })

	c := startCaches(b, client)
	nodes := c.nodes
	verifier := NewNodeChecker(pol, c.bindings, fetch, func(context.Context) ([]byte, error) { return clusterID, nil }, port)
	timed := &timedChecker{checker: verifier}
	var offset atomic.Int64 // the loop's clock runs ahead by this much
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	loop, err := NewLoop(LoopConfig{Client: client, Nodes: nodes, Records: nodeattestation.NewStore(client, namespace), RecordCache: c.records,
		Checker: timed, Events: NewEventRecorder(ctx, client), Heartbeat: benchHeartbeat, Log: log, Registerer: reg, Now: now})
	if err != nil {
		b.Fatal(err)
	}
	writes := func() int { return int(testutil.ToFloat64(loop.metrics.recordWrites)) }
	serverCPU := func() time.Duration { return processCPU() + testenv.ProcessesCPU(b, env.PIDs()) }
	// split is the server side's CPU time by process, for the log.
	split := func() map[string]time.Duration {
		m := map[string]time.Duration{"loop": processCPU()}
		for name, pid := range env.PIDs() {
			m[name] = testenv.ProcessesCPU(b, map[string]int{name: pid})
		}
		return m
	}
	logSplit := func(phase string, before map[string]time.Duration, verifications int) {
		var parts []string
		for name, d := range split() {
			parts = append(parts, fmt.Sprintf("%s %.2f ms", name, float64((d-before[name]).Microseconds())/1e3/float64(verifications)))
		}
		slices.Sort(parts)
		b.Logf("%s: server CPU per re-verification by process: %s", phase, strings.Join(parts, ", "))
	}
	perNode := func(d time.Duration, rounds int) float64 { return float64(d.Microseconds()) / 1e3 / float64(n*rounds) }

	// Idle: what the server side spends doing nothing, for scale.
	cpu, start := serverCPU(), time.Now()
	time.Sleep(3 * time.Second)
	idle := float64((serverCPU() - cpu).Microseconds()) / 1e3 / time.Since(start).Seconds()

	// The first round writes every condition and records an Event each;
	// it is counted until the Nodes' cache and the Events have caught up.
	cpu, rigCPU, start, byProcess := serverCPU(), r.cpu(b), now(), split()
	reattestRound(b, loop, n)
	firstWall := now().Sub(start)
	waitHeartbeats(b, c.records, nodes, start, true)
	events := waitEvents(b, admin, n)
	firstCPU, firstRig, firstWrites := serverCPU()-cpu, r.cpu(b)-rigCPU, writes()
	logSplit("first round", byProcess, n)
	timed.reset()

	// Steady rounds: nothing changed, so nothing is written.
	var steadyCPU, steadyRig, steadyWall time.Duration
	rounds, before := 0, writes()
	byProcess = split()
	for b.Loop() {
		rounds++
		cpu, rigCPU, start := serverCPU(), r.cpu(b), time.Now()
		reattestRound(b, loop, n)
		steadyWall += time.Since(start)
		steadyCPU += serverCPU() - cpu
		steadyRig += r.cpu(b) - rigCPU
	}
	steadyWrites := writes() - before
	logSplit("steady rounds", byProcess, n*rounds)
	if steadyWrites != 0 {
		b.Errorf("%d record writes in %d unchanged rounds, want none", steadyWrites, rounds)
	}
	latencies := timed.sorted()
	// What the loop process keeps between rounds: the informers' caches
	// (Nodes, bindings, records) and each node's kept door connection.
	runtime.GC()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	heapPerNode := float64(mem.HeapAlloc) / 1024 / float64(n)

	// A round with every heartbeat due rewrites every condition.
	offset.Store(int64(benchHeartbeat + time.Minute))
	cpu, before, start, byProcess = serverCPU(), writes(), now(), split()
	reattestRound(b, loop, n)
	waitHeartbeats(b, c.records, nodes, start, false)
	heartbeatCPU, heartbeatWrites := serverCPU()-cpu, writes()-before
	logSplit("heartbeat round", byProcess, n)
	if heartbeatWrites != n {
		b.Errorf("%d record writes in the round with every heartbeat due, want %d", heartbeatWrites, n)
	}

	// The plain verification of one node's evidence, in this process.
	join, _, err := pol.Current()
	if err != nil {
		b.Fatal(err)
	}
	appraisal, err := verifier.appraisalFor(ctx, join)
	if err != nil {
		b.Fatal(err)
	}
	verifies := 0
	cpu, start = processCPU(), time.Now()
	for verifies < 200 || time.Since(start) < time.Second {
		if _, err := appraisal.Verify(ctx, r[0].Evidence, nonce); err != nil {
			b.Fatal(err)
		}
		verifies++
	}
	verifyMs := float64((processCPU() - cpu).Microseconds()) / 1e3 / float64(verifies)

	steady := perNode(steadyCPU, rounds)
	// Production rounds come every DefaultInterval, and rewrite an
	// unchanged record every defaultHeartbeat; the target is 10,000 nodes
	// every 15 s in one core.
	withHeartbeat := steady + (perNode(heartbeatCPU, 1)-steady)*float64(DefaultInterval)/float64(defaultHeartbeat)
	withHeartbeat15s := steady + (perNode(heartbeatCPU, 1)-steady)*float64(15*time.Second)/float64(defaultHeartbeat)

	// The attack: 1 % of the nodes go silent (their endpoints accept and
	// never answer), and one node is compromised (its name now bound to
	// another machine: IdentityChanged, tainted at once). The loop runs
	// every 15 s, as at the target; the compromised node must be tainted
	// within two intervals.
	taintAfter := reattestAttack(b, admin, loop, c, n, port)
	b.ReportMetric(taintAfter.Seconds(), "attack-taint-s")
	if most := 2 * 15 * time.Second * 11 / 10; taintAfter > most {
		b.Errorf("the compromised node was tainted %v after the compromise, with 1 %% of the nodes silent; want within two 15 s intervals (%v)", taintAfter, most)
	}
	b.ReportMetric(float64(n), "nodes")
	b.ReportMetric(float64(nodeBytes)/1e3, "node-kB")
	b.ReportMetric(steady, "server-cpu-ms/reverify")
	b.ReportMetric(withHeartbeat, "server-cpu-ms/reverify+heartbeat")
	b.ReportMetric(verifyMs, "verify-cpu-ms")
	b.ReportMetric(heapPerNode, "loop-heap-kB/node")
	b.ReportMetric(steady/verifyMs, "ratio")
	b.ReportMetric(60e3/withHeartbeat, "nodes/min/core")
	b.ReportMetric(withHeartbeat15s, "server-cpu-ms/reverify+heartbeat@15s")
	b.ReportMetric(15e3/withHeartbeat15s, "nodes/15s/core")
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1e3, "check-p50-ms")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1e3, "check-p99-ms")
	b.ReportMetric(steadyWall.Seconds()/float64(rounds), "round-s")
	b.ReportMetric(float64(steadyWrites)/float64(rounds), "writes/round")
	b.ReportMetric(perNode(steadyRig, rounds), "rig-cpu-ms/reverify")
	b.ReportMetric(perNode(firstCPU, 1), "first-server-cpu-ms/node")
	b.ReportMetric(firstWall.Seconds(), "first-round-s")
	b.ReportMetric(float64(firstWrites), "first-writes")
	b.ReportMetric(float64(events), "first-events")
	b.ReportMetric(perNode(firstRig, 1), "first-rig-cpu-ms/node")
	b.ReportMetric(perNode(heartbeatCPU, 1), "heartbeat-server-cpu-ms/node")
	b.ReportMetric(idle, "idle-server-cpu-ms/s")
}

// reattestRound runs one round of loop over n nodes, every one of which
// must be attested.
func reattestRound(b *testing.B, loop *Loop, n int) {
	b.Helper()
	outcomes, err := loop.Round(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	if len(outcomes) != n {
		b.Fatalf("a round checked %d nodes, want %d", len(outcomes), n)
	}
	for _, o := range outcomes {
		if !o.Attested {
			b.Fatalf("%s is not attested: %s: %s", o.Node, o.Reason, o.Message)
		}
	}
}

// createNodes binds n node names to identity(i) and creates their Nodes,
// node i with rigAddr(i) as InternalIP and a kubelet's status besides. It
// returns the size of one Node's JSON.
func createNodes(b *testing.B, client kubernetes.Interface, n int, identity func(i int) string) int {
	b.Helper()
	bindings := nodebinding.New(client, namespace, time.Now)
	g, ctx := errgroup.WithContext(b.Context())
	g.SetLimit(32)
	var size atomic.Int64
	for i := range n {
		g.Go(func() error {
			name := fmt.Sprintf("worker-%05d", i)
			if _, err := bindings.Bind(ctx, name, identity(i)); err != nil {
				return err
			}
			created, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}}}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			created.Status = kubeletStatus(name, rigAddr(i))
			updated, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
			if err != nil {
				return err
			}
			doc, err := json.Marshal(updated)
			size.Store(int64(len(doc)))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	return int(size.Load())
}

// kubeletStatus is a Node status as a kubelet reports it, with the images
// of a modest node: its size is what a status write and its watch cost.
func kubeletStatus(name, addr string) corev1.NodeStatus {
	q := resource.MustParse
	resources := corev1.ResourceList{corev1.ResourceCPU: q("8"), corev1.ResourceMemory: q("32Gi"),
		corev1.ResourcePods: q("110"), corev1.ResourceEphemeralStorage: q("100Gi")}
	t := metav1.Now()
	s := corev1.NodeStatus{
		Capacity: resources, Allocatable: resources,
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}, {Type: corev1.NodeHostName, Address: name}},
		NodeInfo: corev1.NodeSystemInfo{MachineID: "0123456789abcdef0123456789abcdef", SystemUUID: "01234567-89ab-cdef-0123-456789abcdef",
			BootID: "01234567-89ab-cdef-0123-456789abcdef", KernelVersion: "6.1.0-26-amd64", OSImage: "Debian GNU/Linux 12 (bookworm)",
			ContainerRuntimeVersion: "containerd://1.7.24", KubeletVersion: "v1.36.4", OperatingSystem: "linux", Architecture: "amd64"},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeReady} {
		status, reason := corev1.ConditionFalse, "KubeletHasSufficient"+string(c)
		if c == corev1.NodeReady {
			status, reason = corev1.ConditionTrue, "KubeletReady"
		}
		s.Conditions = append(s.Conditions, corev1.NodeCondition{Type: c, Status: status, Reason: reason,
			Message: "kubelet is posting ready status", LastHeartbeatTime: t, LastTransitionTime: t})
	}
	for i := range 20 {
		s.Images = append(s.Images, corev1.ContainerImage{SizeBytes: 50_000_000 + int64(i)*1_000_000, Names: []string{
			fmt.Sprintf("registry.example/workloads/app-%02d@sha256:%064x", i, i),
			fmt.Sprintf("registry.example/workloads/app-%02d:v1.%d.0", i, i),
		}})
	}
	return s
}

// waitHeartbeats waits until every cached Node carries the condition with
// a heartbeat at or after since: the round's writes came back through the
// watch. It reads the cache only, costing the API server nothing.
func waitHeartbeats(b *testing.B, records *nodeattestation.Cache, nodes *NodeCache, since time.Time, conditions bool) {
	b.Helper()
	err := wait.PollUntilContextTimeout(b.Context(), 10*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		list, err := nodes.List()
		if err != nil {
			return false, nil
		}
		for _, node := range list {
			rec, err := records.Get(node.Name)
			if err != nil || rec.CheckedAt.Before(since) {
				return false, nil
			}
			if c := condition(node); conditions && c == nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		b.Fatalf("the caches did not see the round's writes: %v", err)
	}
}

// reattestAttack makes 1 % of n nodes silent (new Nodes whose addresses,
// 127.4.x.y, accept connections and never answer; checked once, so the
// loop knows them) and then compromises worker-00000 (its binding names
// another machine), runs the loop every 15 s, and returns how long after
// the compromise the node was tainted.
func reattestAttack(b *testing.B, admin kubernetes.Interface, loop *Loop, c caches, n, port int) time.Duration {
	b.Helper()
	ctx := b.Context()
	bindings := nodebinding.New(admin, namespace, time.Now)
	for i := range max(1, n/100) {
		name, addr := fmt.Sprintf("silent-%05d", i), fmt.Sprintf("127.4.%d.%d", i/250, i%250+1)
		holdSilent(b, net.JoinHostPort(addr, strconv.Itoa(port)))
		if _, err := bindings.Bind(ctx, name, "tpm-ak:sha256:"+strings.Repeat("00", 32)); err != nil {
			b.Fatal(err)
		}
		created, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		created.Status = kubeletStatus(name, addr)
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	waitCached(b, admin, c.nodes)
	if _, err := loop.Round(ctx); err != nil {
		b.Fatal(err)
	}
	cms := admin.CoreV1().ConfigMaps(namespace)
	cm, err := cms.Get(ctx, nodebinding.Name("worker-00000"), metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	cm.Data[nodebinding.KeyIdentity] = "tpm-ak:sha256:" + strings.Repeat("11", 32)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	compromised := time.Now()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	loop.cfg.Interval = 15 * time.Second
	go func() { _ = loop.Run(runCtx) }()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		node, err := admin.CoreV1().Nodes().Get(ctx, "worker-00000", metav1.GetOptions{})
		return err == nil && hasTaint(node), nil
	})
	if err != nil {
		b.Fatalf("the compromised node was never tainted: %v", err)
	}
	return time.Since(compromised)
}

// waitEvents waits until n Events are recorded, or their number has not
// grown for 3 s (a recorder drops Events it cannot queue), and returns it.
func waitEvents(b *testing.B, client kubernetes.Interface, n int) int {
	b.Helper()
	count, last, since := 0, -1, time.Now()
	err := wait.PollUntilContextTimeout(b.Context(), 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return false, err
		}
		count = len(list.Items)
		if list.RemainingItemCount != nil {
			count += int(*list.RemainingItemCount)
		}
		if count != last {
			last, since = count, time.Now()
		}
		return count >= n || time.Since(since) > 3*time.Second, nil
	})
	if err != nil {
		b.Fatalf("waiting for the first round's Events: %v", err)
	}
	return count
}

// timedChecker times each Check of the checker it wraps.
type timedChecker struct {
	checker
	mu        sync.Mutex
	latencies []time.Duration
}

func (c *timedChecker) Check(ctx context.Context, node *corev1.Node) (Outcome, error) {
	start := time.Now()
	o, err := c.checker.Check(ctx, node)
	d := time.Since(start)
	c.mu.Lock()
	c.latencies = append(c.latencies, d)
	c.mu.Unlock()
	return o, err
}

func (c *timedChecker) reset() {
	c.mu.Lock()
	c.latencies = nil
	c.mu.Unlock()
}

func (c *timedChecker) sorted() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(slices.Values(c.latencies))
}
