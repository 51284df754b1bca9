package atls

import (
	"crypto/tls"
	"errors"
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
	pair := newTPMPair(t)
	c := newCluster(t)
	c.join(t)
	clk := &clock{now: time.Now()}
	ep := serveEndpoint(t, pair, EvidenceEndpoint{ClientCAFile: c.caFile, Limits: generous(), Now: clk.Now}, nil)
	verifiers := []attestation.Verifier{pair.verifier}
	cert, err := c.verifier(t)()
	if err != nil {
		t.Fatal(err)
	}
	f := fetcher("127.0.0.1", func() (*tls.Certificate, error) { return cert, nil })
	f.Sessions = tls.NewLRUClientSessionCache(16)
	sessions := newCertSessions(f.Sessions, cert)
	fetch := func(want bool) {
		t.Helper()
		quotes := ep.attester.calls.Load()
		r, resumed, err := f.fetch(t.Context(), ep.addr, verifiers, cert, sessions)
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
	clk.Step(2 * DoorTicketKeyLifetime) // the ticket's key is retired
	fetch(false)
	fetch(true)

	if other, ok := newCertSessions(f.Sessions, nil).Get(ep.addr); ok || other != nil {
		t.Fatal("another certificate (none) finds the session made with the verifier's")
	}

	rotated := newCluster(t)
	if err := os.WriteFile(c.caFile, rotated.ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clk.Step(DefaultClientCARecheck)
	quotes := ep.attester.calls.Load()
	_, resumed, err := f.fetch(t.Context(), ep.addr, verifiers, cert, sessions)
	if !resumed || !errors.Is(err, ErrRefused) {
		t.Fatalf("resuming with the old CA's certificate: resumed %v, %v; want a resumed session refused", resumed, err)
	}
	if _, err := f.Fetch(t.Context(), ep.addr, verifiers); !errors.Is(err, ErrRefused) {
		t.Fatalf("fetch with the old CA's certificate: %v, want ErrRefused", err)
	}
	if got := ep.attester.calls.Load() - quotes; got != 0 {
		t.Fatalf("%d quotes for a refused certificate", got)
	}
}

// TestTicketKeysRotate: the door issues tickets under one key for
// DoorTicketKeyLifetime and accepts the previous key for as long again.
func TestTicketKeysRotate(t *testing.T) {
	var k ticketKeys
	t0 := time.Now()
	first, err := k.current(t0)
	if err != nil || len(first) != 1 {
		t.Fatalf("first keys %d, %v", len(first), err)
	}
	same, _ := k.current(t0.Add(DoorTicketKeyLifetime - time.Second))
	if len(same) != 1 || same[0] != first[0] {
		t.Fatal("the key rotated before its lifetime")
	}
	second, _ := k.current(t0.Add(DoorTicketKeyLifetime))
	if len(second) != 2 || second[0] == first[0] || second[1] != first[0] {
		t.Fatal("after its lifetime: want a new key first and the old one kept for decryption")
	}
	third, _ := k.current(t0.Add(2 * DoorTicketKeyLifetime))
	if len(third) != 2 || third[1] != second[0] || third[0] == first[0] || third[1] == first[0] {
		t.Fatal("after two lifetimes the first key must be gone")
	}
	back, _ := k.current(t0) // the clock went back: rotate rather than keep a key from the future
	if back[0] == third[0] {
		t.Fatal("a clock stepped back kept the key")
	}
}
