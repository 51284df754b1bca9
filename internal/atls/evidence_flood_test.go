package atls

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// TestEvidenceFlood: 5,000 ClientHellos from one source on the node
// network (an attacker without a certificate, half of them attested
// ClientHellos as clients from before the door send, half the door's)
// while the join service, from another source, fetches repeatedly: every
// honest fetch succeeds within twice its deadline, every flood connection
// is refused, and the TPM makes no quote for the flood.
func TestEvidenceFlood(t *testing.T) {
	pair := newTPMPair(t)
	c := newCluster(t)
	c.join(t)
	ep := serveEndpoint(t, pair, EvidenceEndpoint{ClientCAFile: c.caFile}, nil) // default limits
	hellos := [][]byte{
		clientHello(t, []string{"h2", nonceProto()}),
		clientHello(t, []string{evidenceProtocol, "h2", nonceProto()}),
	}

	const flood = 5000
	started := make(chan struct{})
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
		var wg sync.WaitGroup
		work := make(chan int)
		for range 16 {
			wg.Go(func() {
				for i := range work {
					conn, err := d.Dial("tcp", ep.addr)
					if err != nil {
						continue // the node refused at once
					}
					_, _ = conn.Write(hellos[i%2])
					_ = conn.Close()
				}
			})
		}
		for i := range flood {
			if i == 100 {
				close(started)
			}
			work <- i
		}
		close(work)
		wg.Wait()
	}()

	<-started
	const deadline = 3 * time.Second
	honest := fetcher("127.0.0.3", c.verifier(t))
	fetches := 0
	for fetches < 8 {
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		start := time.Now()
		_, err := honest.Fetch(ctx, ep.addr, []attestation.Verifier{pair.verifier})
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Fatalf("honest fetch %d during the flood: %v (after %s)", fetches+1, err, took)
		}
		if took > 2*deadline {
			t.Fatalf("honest fetch %d took %s, more than twice its deadline %s", fetches+1, took, deadline)
		}
		fetches++
	}
	<-flooded

	// Every flood connection was refused: at accept (connection limits) or
	// at the door, and none was served.
	deadlineAt := time.Now().Add(30 * time.Second)
	for {
		refused := ep.metric(t, "gatehouse_evidence_connections_refused_total") + ep.metric(t, "gatehouse_evidence_refused_total")
		if refused == flood {
			break
		}
		if time.Now().After(deadlineAt) {
			t.Fatalf("%g of %d flood connections refused", refused, flood)
		}
		time.Sleep(5 * time.Millisecond) // polling, bounded by the deadline above
	}
	if got := ep.metric(t, "gatehouse_evidence_served_total"); got != float64(fetches) {
		t.Errorf("%g handshakes served, want the %d honest fetches", got, fetches)
	}
	if got := ep.attester.calls.Load(); got != int64(fetches) {
		t.Errorf("%d quotes made, want the %d honest fetches': the flood cost quotes", got, fetches)
	}
	if ep.metric(t, "gatehouse_evidence_connections_refused_total", "reason", connlimit.ReasonRate) == 0 {
		t.Error("no flood connection was refused by the handshake rate")
	}
}

// TestQuoteQueue: with the TPM stuck in a quote, one more quote waits;
// a waiter whose handshake deadline passes leaves the queue at once, and a
// connection beyond the queue is refused without a quote.
func TestQuoteQueue(t *testing.T) {
	pair := newTPMPair(t)
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	const timeout = 2 * time.Second
	ep := serveEndpoint(t, pair, EvidenceEndpoint{
		ClientCAFile: t.TempDir() + "/ca.crt", Limits: generous(), QuoteQueue: 1, HandshakeTimeout: timeout,
	}, gate)
	t.Cleanup(release) // before the endpoint stops: it waits for the stuck quote
	verifiers := []attestation.Verifier{pair.verifier}
	fetch := func() (time.Duration, error) {
		start := time.Now()
		_, err := FetchEvidence(context.Background(), ep.addr, verifiers) // the client waits 30 s
		return time.Since(start), err
	}
	type fetched struct {
		took time.Duration
		err  error
	}
	stuck, waiting := make(chan fetched, 1), make(chan fetched, 1)
	go func() {
		took, err := fetch()
		stuck <- fetched{took, err}
	}()
	<-ep.attester.entered // the first quote holds the TPM
	go func() {
		took, err := fetch()
		waiting <- fetched{took, err}
	}()
	// Wait until the second quote waits in the queue (or, without a queue,
	// reached the TPM).
	for waitUntil := time.Now().Add(30 * time.Second); ep.metric(t, "gatehouse_evidence_quotes_pending") != 2 && ep.attester.calls.Load() < 2; {
		if time.Now().After(waitUntil) {
			t.Fatal("the second quote never waited")
		}
		time.Sleep(5 * time.Millisecond) // polling, bounded by the deadline above
	}

	took, err := fetch()
	if err == nil {
		t.Fatal("a connection beyond the queue got evidence")
	}
	if took > timeout {
		t.Errorf("a connection beyond the queue was refused after %s, not at once", took)
	}
	ep.waitMetric(t, 1, "gatehouse_evidence_refused_total", "reason", ReasonQueueFull)

	w := <-waiting
	if w.err == nil {
		t.Fatal("the waiting quote got evidence while the TPM was stuck")
	}
	if w.took > 2*timeout {
		t.Errorf("the waiter left %s after it came, its handshake deadline is %s", w.took, timeout)
	}
	ep.waitMetric(t, 1, "gatehouse_evidence_refused_total", "reason", ReasonQuoteWaitExpired)
	if got := ep.attester.calls.Load(); got != 1 {
		t.Errorf("%d quotes asked of the TPM, want only the stuck one", got)
	}

	release()
	<-stuck
	ep.waitMetric(t, 0, "gatehouse_evidence_quotes_pending")
	if _, err := fetch(); err != nil {
		t.Fatalf("a fetch once the TPM is free: %v", err)
	}
}

// TestEvidenceConnectionLimits: at accept, before any TLS, a source's
// open connections are capped and its new connections rate limited;
// other sources are served meanwhile, and no refused connection costs a
// quote.
func TestEvidenceConnectionLimits(t *testing.T) {
	pair := newTPMPair(t)
	c := newCluster(t)
	c.join(t)
	ep := serveEndpoint(t, pair, EvidenceEndpoint{
		ClientCAFile: c.caFile,
		Limits:       connlimit.Limits{Handshakes: connlimit.Rate{Rate: 0.001, Burst: 3}, PerSource: 2, Total: 100},
	}, nil)
	verifiers := []attestation.Verifier{pair.verifier}

	t.Run("open connections per source", func(t *testing.T) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 5)}}
		for range 2 { // idle: the door waits for their ClientHello
			conn, err := d.Dial("tcp", ep.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
		}
		// Accepted in order: the third is judged after the first two took
		// their slots.
		conn, err := d.Dial("tcp", ep.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if n, err := conn.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("a third open connection from one source: read %d, %v; want it closed at once", n, err)
		}
		ep.waitMetric(t, 1, "gatehouse_evidence_connections_refused_total", "reason", connlimit.ReasonSourceConnections)
		if _, err := fetcher("127.0.0.6", c.verifier(t)).Fetch(t.Context(), ep.addr, verifiers); err != nil {
			t.Fatalf("another source while one holds its cap: %v", err)
		}
	})

	t.Run("new connections per source", func(t *testing.T) {
		quotes := ep.attester.calls.Load()
		f := fetcher("127.0.0.7", c.verifier(t))
		for i := range 3 {
			if _, err := f.Fetch(t.Context(), ep.addr, verifiers); err != nil {
				t.Fatalf("fetch %d within the burst: %v", i+1, err)
			}
		}
		if _, err := f.Fetch(t.Context(), ep.addr, verifiers); err == nil {
			t.Fatal("a fetch beyond the handshake budget got evidence")
		}
		ep.waitMetric(t, 1, "gatehouse_evidence_connections_refused_total", "reason", connlimit.ReasonRate)
		if got := ep.attester.calls.Load() - quotes; got != 3 {
			t.Errorf("%d quotes for 3 fetches within the budget and one beyond it", got)
		}
		if _, err := fetcher("127.0.0.8", c.verifier(t)).Fetch(t.Context(), ep.addr, verifiers); err != nil {
			t.Fatalf("another source after one spent its budget: %v", err)
		}
	})
}
