package atls

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// TestDoorSessionsResume: a caller with Sessions resumes the door's
// session on its next fetch from a node, and still gets fresh evidence (a
// quote per fetch); tickets stop resuming once their key is retired; and
// a resumed session whose certificate the node no longer accepts (its CA
// changed) is refused, with no quote, instead of being trusted because
// it was accepted once.
func TestDoorSessionsResume(t *testing.T) {
	c, clk, ep, verifiers, cert, f := joinedDoor(t)
	f.Sessions = tls.NewLRUClientSessionCache(16)
	sessions := newCertSessions(f.Sessions, cert)
	fetch := func(want bool) {
		t.Helper()
		quotes := ep.attester.calls.Load()
		r, _, resumed, err := f.fetch(t.Context(), ep.addr, verifiers, cert, sessions, false)
		if err != nil || r == nil {
			t.Fatalf("fetch: %v", err)
		}
		if resumed != want {
			t.Fatalf("resumed = %v, want %v", resumed, want)
		}
		if got := ep.attester.calls.Load() - quotes; got != 1 {
			t.Fatalf("%d quotes for one fetch, want 1: evidence is fresh on every connection", got)
		}
	}

	fetch(false)
	fetch(true)
	fetch(true)
	clk.Step(2 * doorTicketKeyLifetime) // the ticket's key is retired
	fetch(false)
	fetch(true)

	if other, ok := newCertSessions(f.Sessions, nil).Get(ep.addr); ok || other != nil {
		t.Fatal("another certificate (none) finds the session made with the verifier's")
	}

	rotated := newCluster(t)
	if err := os.WriteFile(c.caFile, rotated.ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clk.Step(defaultClientCARecheck)
	quotes := ep.attester.calls.Load()
	_, _, resumed, err := f.fetch(t.Context(), ep.addr, verifiers, cert, sessions, false)
	if !resumed || !errors.Is(err, ErrRefused) {
		t.Fatalf("resuming with the old CA's certificate: resumed %v, %v; want a resumed session refused", resumed, err)
	}
	if _, err := f.Fetch(t.Context(), ep.addr, verifiers); !errors.Is(err, ErrRefused) {
		t.Fatalf("fetch with the old CA's certificate: %v, want ErrRefused", err)
	}
	if got := ep.attester.calls.Load() - quotes; got != 0 {
		t.Fatalf("%d quotes for a refused certificate", got)
	}
	// The resumed handshake, then Fetch's full one (the refusal dropped
	// the session).
	ep.waitMetric(t, 2, "gatehouse_evidence_refused_total", "reason", ReasonUntrustedCertificate)
}

// joinedDoor serves the door of a node that joined cluster c, on clock
// clk, and returns a fetcher presenting the join service's certificate
// cert of c.
func joinedDoor(t *testing.T) (c *cluster, clk *clock, ep *endpoint, verifiers []attestation.Verifier, cert *tls.Certificate, f EvidenceFetcher) {
	t.Helper()
	pair := newTPMPair(t)
	c = newCluster(t)
	c.join(t)
	clk = &clock{now: time.Now()}
	ep = serveEndpoint(t, pair, EvidenceEndpoint{ClientCAFile: c.caFile, Limits: generous(), Now: clk.Now}, nil)
	cert, err := c.verifier(t)()
	if err != nil {
		t.Fatal(err)
	}
	f = fetcher("127.0.0.1", func() (*tls.Certificate, error) { return cert, nil })
	return c, clk, ep, []attestation.Verifier{pair.verifier}, cert, f
}

// TestTicketKeysRotate: the door issues tickets under one key for
// doorTicketKeyLifetime and accepts the previous key for as long again.
func TestTicketKeysRotate(t *testing.T) {
	var k ticketKeys
	t0 := time.Now()
	first, err := k.current(t0)
	if err != nil || len(first) != 1 {
		t.Fatalf("first keys %d, %v", len(first), err)
	}
	same, _ := k.current(t0.Add(doorTicketKeyLifetime - time.Second))
	if len(same) != 1 || same[0] != first[0] {
		t.Fatal("the key rotated before its lifetime")
	}
	second, _ := k.current(t0.Add(doorTicketKeyLifetime))
	if len(second) != 2 || second[0] == first[0] || second[1] != first[0] {
		t.Fatal("after its lifetime: want a new key first and the old one kept for decryption")
	}
	third, _ := k.current(t0.Add(2 * doorTicketKeyLifetime))
	if len(third) != 2 || third[1] != second[0] || third[0] == first[0] || third[1] == first[0] {
		t.Fatal("after two lifetimes the first key must be gone")
	}
	back, _ := k.current(t0) // the clock went back: rotate rather than keep a key from the future
	if back[0] == third[0] {
		t.Fatal("a clock stepped back kept the key")
	}
}

// TestDoorConnectionsAreKept: with Conns, the next fetch from a node asks
// again over the kept connection (a fresh quote, no handshake); a node
// that closed it while idle gets a new one; and a kept connection whose
// certificate the node no longer accepts (its CA changed) gets no quote.
func TestDoorConnectionsAreKept(t *testing.T) {
	c, clk, ep, verifiers, cert, f := joinedDoor(t)
	f.Conns = NewEvidenceConns(4)
	t.Cleanup(f.Conns.Close)
	key := certID(cert) + " " + ep.addr
	kept := func() *tls.Conn {
		f.Conns.mu.Lock()
		defer f.Conns.mu.Unlock()
		return f.Conns.conns[key]
	}
	fetch := func() {
		t.Helper()
		quotes := ep.attester.calls.Load()
		if _, err := f.Fetch(t.Context(), ep.addr, verifiers); err != nil {
			t.Fatalf("fetch: %v", err)
		}
		if got := ep.attester.calls.Load() - quotes; got != 1 {
			t.Fatalf("%d quotes for one fetch, want 1", got)
		}
	}

	fetch()
	first := kept()
	if first == nil {
		t.Fatal("no connection kept after the first fetch")
	}
	fetch()
	fetch()
	if kept() != first {
		t.Fatal("a later fetch did not ask over the kept connection")
	}
	ep.waitMetric(t, 1, "gatehouse_evidence_connections_open")

	rotated := newCluster(t)
	if err := os.WriteFile(c.caFile, rotated.ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clk.Step(defaultClientCARecheck)
	quotes := ep.attester.calls.Load()
	if _, err := f.Fetch(t.Context(), ep.addr, verifiers); !errors.Is(err, ErrRefused) {
		t.Fatalf("fetch over a kept connection after the CA changed: %v, want ErrRefused", err)
	}
	if got := ep.attester.calls.Load() - quotes; got != 0 {
		t.Fatalf("%d quotes for a certificate the node no longer accepts", got)
	}
	ep.waitMetric(t, 2, "gatehouse_evidence_refused_total", "reason", ReasonUntrustedCertificate)
	if kept() != nil {
		t.Fatal("a refused connection is kept")
	}
}

// TestIdleDoorConnectionsAreClosed: a node closes a kept connection its
// caller leaves idle for IdleTimeout; the caller's next fetch makes a new
// one, unaware.
func TestIdleDoorConnectionsAreClosed(t *testing.T) {
	pair := newTPMPair(t)
	ep := serveEndpoint(t, pair, EvidenceEndpoint{anonymous: true, IdleTimeout: 50 * time.Millisecond}, nil)
	f := EvidenceFetcher{Conns: NewEvidenceConns(4)}
	t.Cleanup(f.Conns.Close)
	verifiers := []attestation.Verifier{pair.verifier}
	if _, err := f.Fetch(t.Context(), ep.addr, verifiers); err != nil {
		t.Fatal(err)
	}
	ep.waitMetric(t, 1, "gatehouse_evidence_served_total")
	quotes := ep.attester.calls.Load()
	// The node closes the idle connection; poll until the client's kept
	// connection reads its end.
	conn := f.Conns.take(" " + ep.addr)
	if conn == nil {
		t.Fatal("no connection kept")
	}
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("the node sent data on an idle connection")
	}
	f.Conns.put(" "+ep.addr, conn)
	if _, err := f.Fetch(t.Context(), ep.addr, verifiers); err != nil {
		t.Fatalf("fetch after the node closed the kept connection: %v", err)
	}
	if got := ep.attester.calls.Load() - quotes; got != 1 {
		t.Fatalf("%d quotes, want 1", got)
	}
}

// TestKeptConnectionEvidenceIsFresh: a node answering a later request on a
// kept connection with evidence for an earlier nonce (its first evidence,
// replayed) is refused.
func TestKeptConnectionEvidenceIsFresh(t *testing.T) {
	pair := newTPMPair(t)
	door, err := doorCertificate(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	server := tls.Server(b, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{door}})
	client := tls.Client(a, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}) // the door's certificate proves nothing
	defer client.Close()
	go func() {
		defer server.Close()
		if server.Handshake() != nil {
			return
		}
		if _, err := readFrameMax(server, attestation.NonceSize); err != nil {
			return
		}
		stale, err := channelNonce(server.ConnectionState(), nil) // the first evidence's nonce
		if err != nil {
			return
		}
		evidence, err := pair.attester.Attest(context.Background(), channelUserData(), stale)
		if err != nil {
			return
		}
		_ = writeFrameMax(server, []byte(pair.attester.Variant()), maxVariantSize)
		_ = writeFrameMax(server, evidence, attestation.MaxEvidenceSize)
		_, _ = io.Copy(io.Discard, server)
	}()
	if err := client.HandshakeContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, err = again(t.Context(), client, []attestation.Verifier{pair.verifier})
	if !errors.Is(err, errEvidenceInvalid) || !errors.Is(err, attestation.ErrNonce) || !rejected(err) {
		t.Fatalf("replayed evidence on a kept connection: %v, want ErrEvidenceInvalid wrapping attestation.ErrNonce", err)
	}
}
