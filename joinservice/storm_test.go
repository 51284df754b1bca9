package joinservice

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// stormNodes is how many simulated nodes join at once in the CI storm
// tests and the benchmark (bench/joinservice.sh).
const stormNodes = 200

// stormResult is one simulated node's outcome.
type stormResult struct {
	name     string
	ticket   *joinservicev1.IssueJoinTicketResponse
	err      error
	attempts int
	latency  time.Duration // of the successful attempt, handshake included
}

// joinStorm makes n simulated nodes join concurrently (see runStorm), with
// this process's simulated TPM.
func joinStorm(ctx context.Context, t testing.TB, h *harness, n int, retry bool, onAttempt func(i int, err error), hold func(ctx context.Context, i int)) ([]stormResult, time.Duration) {
	t.Helper()
	joiners, closeAll, err := newJoiners(h.addr, h.caHash, h.node.attester, n)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	return runStorm(ctx, joiners, retry, onAttempt, hold)
}

// joiner is one simulated node, ready to ask for its ticket.
type joiner struct {
	name   string
	client joinservicev1.JoinServiceClient
	req    *joinservicev1.IssueJoinTicketRequest
}

// newJoiners prepares n nodes named storm-NNN, each with its own CSR and
// its own attested TLS connection (made on first use) from its own loopback
// source address. The returned function closes the connections.
func newJoiners(addr, caHash string, attester attestation.Attester, n int) ([]joiner, func(), error) {
	joiners := make([]joiner, n)
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for i := range joiners {
		name := fmt.Sprintf("storm-%03d", i)
		conn, err := dialJoinService(addr, caHash, attester, fmt.Sprintf("127.1.%d.%d", i/250, i%250+1))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, conn)
		csr, _, err := newNodeCSR(name, net.IPv4(10, 1, byte(i/250), byte(i%250+1)))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		joiners[i] = joiner{name: name, client: joinservicev1.NewJoinServiceClient(conn),
			req: &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString(), CertificateRequest: csr}}
	}
	return joiners, closeAll, nil
}

// runStorm has all joiners ask for their tickets at once. With retry, a
// node retries Unavailable errors with exponential backoff and jitter (as
// the bootstrapper's JoinClient does) until ctx ends. onAttempt, if set,
// runs after each of node i's requests with its error; hold, if set, runs
// before node i's first request (it may block). It returns each node's
// outcome and the wall time until the last finished.
func runStorm(ctx context.Context, joiners []joiner, retry bool, onAttempt func(i int, err error), hold func(ctx context.Context, i int)) ([]stormResult, time.Duration) {
	results := make([]stormResult, len(joiners))
	var wg sync.WaitGroup
	start := time.Now()
	for i, j := range joiners {
		wg.Go(func() {
			r := &results[i]
			r.name = j.name
			if hold != nil {
				hold(ctx, i)
			}
			backoff := 50 * time.Millisecond
			for {
				r.attempts++
				began := time.Now()
				r.ticket, r.err = j.client.IssueJoinTicket(ctx, j.req)
				r.latency = time.Since(began)
				if onAttempt != nil {
					onAttempt(i, r.err)
				}
				if r.err == nil {
					return
				}
				if !retry || status.Code(r.err) != codes.Unavailable {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff/2 + rand.N(backoff/2)):
				}
				backoff = min(2*backoff, time.Second)
			}
		})
	}
	wg.Wait()
	return results, time.Since(start)
}

// checkStorm asserts every node got exactly one valid ticket: no errors,
// distinct tokens each backed by its Secret, kubelet certificates that verify
// against the cluster CA, and no other token Secret (no orphans).
func checkStorm(t testing.TB, h *harness, results []stormResult) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(h.env.CACertPEM)
	tokens := map[string]string{}
	for _, r := range results {
		if r.err != nil {
			t.Errorf("%s: %v after %d attempts", r.name, r.err, r.attempts)
			continue
		}
		if prev, dup := tokens[r.ticket.GetToken()]; dup {
			t.Errorf("%s and %s got the same token", prev, r.name)
		}
		tokens[r.ticket.GetToken()] = r.name
		cert, err := x509.ParseCertificate(r.ticket.GetKubeletCert())
		if err != nil {
			t.Errorf("%s: kubelet certificate: %v", r.name, err)
			continue
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil ||
			cert.Subject.CommonName != "system:node:"+r.name {
			t.Errorf("%s: kubelet certificate %s does not verify: %v", r.name, cert.Subject, err)
		}
	}
	secrets := h.tokenSecrets(t)
	if len(secrets) != len(results) {
		t.Errorf("%d token Secrets for %d nodes", len(secrets), len(results))
	}
	for _, s := range secrets {
		token := string(s.Data["token-id"]) + "." + string(s.Data["token-secret"])
		if _, ok := tokens[token]; !ok || !bootstraputil.IsValidBootstrapToken(token) {
			t.Errorf("token Secret %s holds no node's token (an orphan)", s.Name)
		}
	}
}

// TestJoinStorm has 200 nodes join at once: all succeed with distinct valid
// tokens and certificates. Speed is measured by BenchmarkJoinStorm.
func TestJoinStorm(t *testing.T) {
	h := newHarness(t, harnessOptions{discardLog: true})
	results, elapsed := joinStorm(t.Context(), t, h, stormNodes, false, nil, nil)
	checkStorm(t, h, results)
	t.Logf("%d joins in %s (with -race; see BenchmarkJoinStorm for speed)", len(results), elapsed)
}

// TestJoinStormSurvivesRestarts restarts what the join service depends on
// while 200 nodes join: on the first ticket it is stopped; half the nodes
// start only once it is down, and it comes back only after each of them
// has tried once, so they meet it down for certain. Nodes retry
// Unavailable errors; in the end each has exactly one valid ticket, there
// is no orphaned token Secret, and the refusals name what was down.
func TestJoinStormSurvivesRestarts(t *testing.T) {
	for _, tc := range []struct {
		name        string
		stop        func(h *harness) error
		start       func(ctx context.Context, h *harness) error
		refusedWith string // the verdicts' reason while it was down
	}{
		{
			name:        "API server",
			stop:        func(h *harness) error { return h.env.StopAPIServer() },
			start:       func(ctx context.Context, h *harness) error { return h.env.StartAPIServer(ctx) },
			refusedWith: "api_error",
		},
		{
			name:        "key service",
			stop:        (*harness).stopKeyService,
			start:       func(ctx context.Context, h *harness) error { return h.restartKeyService(ctx) },
			refusedWith: "key_service_error",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{discardLog: true})
			stormWithRestart(t, h, func() error { return tc.stop(h) }, func(ctx context.Context) error { return tc.start(ctx, h) })
			if n := h.verdicts(t, "IssueJoinTicket", "refused", tc.refusedWith); n == 0 {
				t.Fatalf("no join was refused with reason %q while the %s was down: the fault missed the storm", tc.refusedWith, tc.name)
			}
			// The informers reconnected: a policy update after the restart applies.
			h.putConfigMap(t, testDenyList, map[string]string{"denied": "node:after-restart\n"})
			h.waitReloads(t, testDenyList, "applied", 1)
		})
	}
}

// stormWithRestart runs a storm of stormNodes retrying nodes during which,
// at the first ticket issued, stop runs; nodes [stormNodes/2, stormNodes)
// start only once it has, and start runs once each of them has tried once.
// It checks the storm's outcome (checkStorm) and that some node retried.
func stormWithRestart(t *testing.T, h *harness, stop func() error, start func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	held := stormNodes / 2 // nodes [held, stormNodes) wait for the restart
	var restart sync.Once
	down := make(chan struct{})
	tried := make([]sync.Once, stormNodes)
	var heldTried sync.WaitGroup
	heldTried.Add(stormNodes - held)
	restarted := make(chan error, 1)
	onAttempt := func(i int, err error) {
		if i >= held {
			tried[i].Do(heldTried.Done)
		}
		if err != nil {
			return
		}
		// The first ticket means the storm is under way: restart now.
		restart.Do(func() {
			go func() {
				if err := stop(); err != nil {
					restarted <- err
					return
				}
				close(down)
				heldTried.Wait()
				restarted <- start(ctx)
			}()
		})
	}
	hold := func(ctx context.Context, i int) {
		if i >= held {
			select {
			case <-down:
			case <-ctx.Done():
			}
		}
	}
	results, _ := joinStorm(ctx, t, h, stormNodes, true, onAttempt, hold)
	select {
	case err := <-restarted:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("no node got a ticket before the deadline, so nothing was restarted")
	}
	checkStorm(t, h, results)
	if !slices.ContainsFunc(results, func(r stormResult) bool { return r.attempts > 1 }) {
		t.Fatal("no node had to retry: the restart did not hit the storm")
	}
}

// BenchmarkJoinStorm measures joins per second of 200 concurrent nodes
// (attested TLS handshake with a simulated TPM quote, evidence verification,
// two key service calls over mutual TLS, a kubelet certificate, a bootstrap
// token Secret) and, in the same run against the same API server and client
// settings, the raw rate of bootstrap token Secret creations by 200
// concurrent callers. The nodes run in a rig process of their own (see
// startRig). It reports joins/s, p50/p99 latency, creates/s and their
// ratio, the CPU time per join and per create of the server side (this
// process with the join and key services, the API server, etcd and
// kube-controller-manager) and their ratio (cpu-ratio, the target in
// docs/benchmarks.md), and the rig's CPU per join; it logs both phases' CPU
// by process and the API server's requests by verb and resource. Each
// phase's CPU is counted until the bootstrap signer has caught up, so
// neither phase pays for the other's token signing. Run it with
// bench/joinservice.sh.
func BenchmarkJoinStorm(b *testing.B) {
	// Side by side in one run: the key service's master secret plain
	// (cluster-kms) and wrapped by an external KMS (a real AWS KMS API
	// server), which unwraps it at start and holds it in memory.
	for _, backend := range []string{"cluster-kms", "aws-kms"} {
		b.Run(backend, func(b *testing.B) { benchJoinStorm(b, harnessOptions{discardLog: true, awsKMS: backend == "aws-kms"}) })
	}
}

func benchJoinStorm(b *testing.B, opts harnessOptions) {
	h := newHarness(b, opts)
	r := startRig(b)
	h.extraAKs = append(h.extraAKs, r.ak)
	h.putConfigMap(b, testJoinConfig, h.joinConfigData(b, nil))
	h.waitReloads(b, testJoinConfig, "applied", 2)
	client, err := kubernetes.NewForConfig(apiClientConfig(h.env))
	if err != nil {
		b.Fatal(err)
	}
	prof := newPhaseProfiler(b, client)
	// One round: a storm of new nodes, then as many raw creates, added up
	// in t. Each phase is measured from before its first request until the
	// bootstrap signer has signed for its tokens; the API server's request
	// counts are read outside that window (reading them costs it CPU too).
	// Both phases' tokens, and the storm's node-name bindings (every round
	// joins new nodes, as in a real cluster), are deleted outside it.
	round := func(n int, t *tally, prof *phaseProfiler) {
		reqs := readAPIRequests(b, client)
		stopProfile := prof.start(b, "join", n)
		cpu, start := serverCPU(b, h), time.Now()
		results, report := r.storm(b, h, stormNodes)
		waitSigned(b, client, stormNodes)
		t.joinCPU.add(cpu, serverCPU(b, h))
		t.joinWall += time.Since(start)
		stopProfile()
		checkStorm(b, h, results)
		t.joinReqs.Add(reqs, readAPIRequests(b, client))
		t.rigCPU += report.CPU
		for _, r := range results {
			t.latencies = append(t.latencies, r.latency)
		}
		t.joinRate += float64(len(results)) / report.Elapsed.Seconds()
		deleteTokens(b, client)
		deleteBindings(b, client)
		waitSigned(b, client, 0)

		reqs = readAPIRequests(b, client)
		stopProfile = prof.start(b, "create", n)
		cpu, start = serverCPU(b, h), time.Now()
		rate := rawTokenCreates(b, client, stormNodes, n)
		waitSigned(b, client, stormNodes)
		t.createCPU.add(cpu, serverCPU(b, h))
		t.createWall += time.Since(start)
		stopProfile()
		t.createReqs.Add(reqs, readAPIRequests(b, client))
		t.rawRate += rate
		t.rounds++
		deleteTokens(b, client)
		waitSigned(b, client, 0)
	}
	// A first, cold round is logged but not counted: it may open
	// connections (the API server's, the key service's) that a running
	// service has open, and that the raw creates, coming after it and
	// sharing the client's connection pool, would never pay for.
	cold := newTally()
	round(0, cold, nil)
	// Idle: what the server side spends while nothing happens, for scale
	// (a longer phase pays more of it).
	cpu, start := serverCPU(b, h), time.Now()
	time.Sleep(2 * time.Second)
	idle := float64((serverCPU(b, h).total() - cpu.total()).Microseconds()) / 1e3 / time.Since(start).Seconds()
	t := newTally()
	for b.Loop() {
		round(t.rounds+1, t, prof)
	}
	slices.Sort(t.latencies)
	ops := t.rounds * stormNodes
	perOp := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(ops) }
	joinRate, rawRate := t.joinRate/float64(t.rounds), t.rawRate/float64(t.rounds)
	b.ReportMetric(joinRate, "joins/s")
	b.ReportMetric(rawRate, "secret-creates/s")
	b.ReportMetric(joinRate/rawRate, "ratio")
	b.ReportMetric(float64(t.latencies[len(t.latencies)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(t.latencies[len(t.latencies)*99/100].Milliseconds()), "p99-ms")
	b.ReportMetric(perOp(t.joinCPU.total()), "server-cpu-ms/join")
	b.ReportMetric(perOp(t.createCPU.total()), "server-cpu-ms/create")
	b.ReportMetric(float64(t.joinCPU.total())/float64(t.createCPU.total()), "cpu-ratio")
	b.ReportMetric(perOp(t.rigCPU), "rig-cpu-ms/join")
	b.Logf("server CPU per join by process: %s", t.joinCPU.perOp(ops))
	b.Logf("server CPU per raw create by process: %s", t.createCPU.perOp(ops))
	b.Logf("API requests per join (cluster-info polls included): %s", t.joinReqs.PerOp(ops))
	b.Logf("API requests per raw create (cluster-info polls included): %s", t.createReqs.PerOp(ops))
	b.Logf("first (cold) round, not counted: server CPU per join %s; per raw create %s",
		cold.joinCPU.perOp(stormNodes), cold.createCPU.perOp(stormNodes))
	b.Logf("idle server side: %.1f ms of CPU per second; a join phase lasted %.2f s, a create phase %.2f s",
		idle, t.joinWall.Seconds()/float64(t.rounds), t.createWall.Seconds()/float64(t.rounds))
}

// tally adds up BenchmarkJoinStorm's rounds.
type tally struct {
	rounds               int
	joinRate, rawRate    float64 // sums of the rounds' rates
	rigCPU               time.Duration
	joinWall, createWall time.Duration
	joinCPU, createCPU   cpuSplit
	joinReqs, createReqs testenv.APIRequests
	latencies            []time.Duration
}

func newTally() *tally {
	return &tally{joinCPU: cpuSplit{}, createCPU: cpuSplit{}, joinReqs: testenv.APIRequests{}, createReqs: testenv.APIRequests{}}
}

// readAPIRequests reads the API server's request counts
// (testenv.ReadAPIRequests).
func readAPIRequests(b *testing.B, client kubernetes.Interface) testenv.APIRequests {
	b.Helper()
	counts, err := testenv.ReadAPIRequests(b.Context(), client.CoreV1().RESTClient())
	if err != nil {
		b.Fatal(err)
	}
	return counts
}

// waitSigned polls until the bootstrap signer (kube-controller-manager) has
// signed cluster-info for exactly n tokens.
func waitSigned(b *testing.B, client kubernetes.Interface, n int) {
	b.Helper()
	err := wait.PollUntilContextTimeout(b.Context(), 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cm, err := client.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		signed := 0
		for k := range cm.Data {
			if strings.HasPrefix(k, bootstrapapi.JWSSignatureKeyPrefix) {
				signed++
			}
		}
		return signed == n, nil
	})
	if err != nil {
		b.Fatalf("waiting for cluster-info to be signed for %d tokens: %v", n, err)
	}
}

// rawTokenCreates creates n bootstrap token Secrets from n goroutines and
// returns creations per second.
func rawTokenCreates(b *testing.B, client kubernetes.Interface, n, round int) float64 {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			_, s, err := requestTokens.NewSecret(fmt.Sprintf("raw-%d-%d", round, i), time.Now().Add(tokenTTL), "raw rate")
			if err == nil {
				_, err = client.CoreV1().Secrets(metav1.NamespaceSystem).Create(b.Context(), s, metav1.CreateOptions{})
			}
			errs <- err
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			b.Fatal(err)
		}
	}
	return float64(n) / elapsed.Seconds()
}

// deleteBindings removes the node-name bindings a storm made.
func deleteBindings(b *testing.B, client kubernetes.Interface) {
	b.Helper()
	err := client.CoreV1().ConfigMaps(testNamespace).DeleteCollection(b.Context(), metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: nodebinding.Label + "=true"})
	if err != nil {
		b.Fatal(err)
	}
}

func deleteTokens(b *testing.B, client kubernetes.Interface) {
	b.Helper()
	err := client.CoreV1().Secrets(metav1.NamespaceSystem).DeleteCollection(b.Context(), metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"})
	if err != nil {
		b.Fatal(err)
	}
}
