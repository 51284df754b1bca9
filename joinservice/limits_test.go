package joinservice

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// TestHandshakeTimeout: a client that opens a connection and never
// finishes the attested handshake holds it only for the handshake timeout;
// the refusal is audited and counted.
func TestHandshakeTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{limits: ConnectionLimits{HandshakeTimeout: 300 * time.Millisecond}})
	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Say nothing; the server must give up and close.
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes from a connection that never handshook; want the server to close it", n)
	} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server kept a silent connection open for 30 s; want it closed after the handshake timeout")
	}
	h.waitAudit(t, "handshake", "refused", "handshake_timeout")
}

// countingAttester counts the quotes a client makes: a connection the
// service refuses before the handshake costs none.
type countingAttester struct {
	attestation.Attester
	quotes atomic.Int64
}

func (c *countingAttester) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	c.quotes.Add(1)
	return c.Attester.Attest(ctx, userData, nonce)
}

// TestConnectionLimits: a source over its handshake budget or its open
// connections is turned away before any attestation work (no quote made, no
// evidence verified), audited and counted; other sources are not affected.
func TestConnectionLimits(t *testing.T) {
	h := newHarness(t, harnessOptions{listen: connlimit.Limits{Handshakes: connlimit.Rate{Rate: 0.001, Burst: 3}, PerSource: 2}})
	ctx := t.Context()
	attester := &countingAttester{Attester: h.node.attester}
	req := &joinservicev1.IssueRejoinTicketRequest{DiskUuid: uuid.NewString()}
	call := func(src string) error {
		conn, err := dialJoinService(h.addr, h.caHash, attester, src)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		_, err = joinservicev1.NewJoinServiceClient(conn).IssueRejoinTicket(ctx, req)
		return err
	}
	// Two open connections from one source are its cap.
	for i := range 2 {
		if err := call("127.0.0.60"); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
	quotes := attester.quotes.Load()
	if err := call("127.0.0.60"); status.Code(err) != codes.Unavailable {
		t.Fatalf("third open connection from one source: %v, want it closed before the handshake", err)
	}
	h.waitAudit(t, "handshake", "refused", connlimit.ReasonSourceConnections)
	// Another source is not affected.
	if err := call("127.0.0.61"); err != nil {
		t.Fatalf("another source: %v", err)
	}
	quotes++ // the other source's handshake
	// The fourth new connection from the first source is over its
	// handshake budget (burst 3), whatever its open connections.
	if err := call("127.0.0.60"); status.Code(err) != codes.Unavailable {
		t.Fatalf("over the handshake budget: %v, want it closed before the handshake", err)
	}
	h.waitAudit(t, "handshake", "refused", connlimit.ReasonRate)
	if got := attester.quotes.Load(); got != quotes {
		t.Errorf("the client made %d quotes, want %d: refused connections must cost no attestation", got, quotes)
	}
	for reason, want := range map[string]float64{connlimit.ReasonSourceConnections: 1, connlimit.ReasonRate: 1} {
		if got := testutil.ToFloat64(h.server.metrics.verdicts.WithLabelValues("handshake", "refused", reason)); got < want {
			t.Errorf("verdicts{handshake, refused, %s} = %v, want at least %v", reason, got, want)
		}
	}
}

// TestConnectionMaxAge: no attestation outlives its connection's maximum
// age; the server closes the connection and the node attests again on a
// new one.
func TestConnectionMaxAge(t *testing.T) {
	h := newHarness(t, harnessOptions{limits: ConnectionLimits{MaxAge: 500 * time.Millisecond, MaxAgeGrace: 100 * time.Millisecond}})
	attester := &countingAttester{Attester: h.node.attester}
	conn, err := dialJoinService(h.addr, h.caHash, attester, "127.0.0.70")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := joinservicev1.NewJoinServiceClient(conn)
	req := &joinservicev1.IssueRejoinTicketRequest{DiskUuid: uuid.NewString()}
	if _, err := client.IssueRejoinTicket(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if got := attester.quotes.Load(); got != 1 {
		t.Fatalf("%d quotes for one connection, want 1", got)
	}
	// Keep asking (a request may meet the closing connection and fail:
	// that is the point); the node must have attested again.
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, _ = client.IssueRejoinTicket(ctx, req)
		return attester.quotes.Load() >= 2, nil
	})
	if err != nil {
		t.Fatalf("the connection outlived its maximum age: still %d quote(s): %v", attester.quotes.Load(), err)
	}
}
