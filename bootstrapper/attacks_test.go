package bootstrapper

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	testingclock "k8s.io/utils/clock/testing"

	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// quoteCounter counts the node's TPM quotes: one per attested handshake.
type quoteCounter struct {
	attestation.Attester
	quotes atomic.Int64
}

func (q *quoteCounter) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	q.quotes.Add(1)
	return q.Attester.Attest(ctx, userData, nonce)
}

// initTarget is a node's InitServer behind the production connection
// limits, as an attacker on the network meets it.
type initTarget struct {
	f      *initFixture
	addr   string
	clock  *testingclock.FakeClock
	reg    *prometheus.Registry
	quotes *quoteCounter
}

func newInitTarget(t *testing.T, attempts SecretAttemptLimits, listen connlimit.Limits) *initTarget {
	t.Helper()
	f := newInitFixture(t)
	tg := &initTarget{f: f, clock: testingclock.NewFakeClock(time.Now()), reg: prometheus.NewRegistry(), quotes: &quoteCounter{Attester: f.node.attester}}
	hash, err := bcrypt.GenerateFromPassword(f.secret, bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	f.server, err = NewInitServer(InitServerConfig{
		Machine: f.node.machine, Lock: f.node.lock, Identity: f.node.identity(t), InitSecretHash: hash, BindName: (&nameBindings{}).bind,
		Now: tg.clock.Now, SecretAttempts: attempts, Registerer: tg.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := atls.NewCredentials(atls.Config{Attester: tg.quotes})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	initservicev1.RegisterInitServiceServer(srv, f.server)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis, err := connlimit.NewListener(inner, listen, connlimit.Options{Now: tg.clock.Now, Registerer: tg.reg, Subsystem: "bootstrapper"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	tg.addr = inner.Addr().String()
	return tg
}

// init sends an Init with secret from source and returns the stream's
// error.
func (tg *initTarget) init(t *testing.T, source string, secret []byte) error {
	t.Helper()
	creds, err := atls.NewCredentials(atls.Config{Verifiers: []attestation.Verifier{verifier(t, tg.f.node.attester)}})
	if err != nil {
		t.Fatal(err)
	}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	conn, err := grpc.NewClient(tg.addr, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	req := tg.f.req
	req.InitSecret = secret
	stream, err := initservicev1.NewInitServiceClient(conn).Init(t.Context(), req)
	if err != nil {
		return err
	}
	_, _, err = receive(t, stream)
	return err
}

// metric returns the value of counter name{reason} in reg.
func metric(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == name && m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s{reason=%q}", name, reason)
	return 0
}

func (tg *initTarget) refused(t *testing.T, reason string) float64 {
	t.Helper()
	return metric(t, tg.reg, "gatehouse_bootstrapper_init_refused_total", reason)
}

// TestInitAttacks: what a network attacker tries against a node waiting for
// `gatehouse init`. Each attack is refused with the precise code, leaves the
// node unchanged (no node lock, no re-keyed disk, no file), is counted, and
// no secret reaches the node's log.
func TestInitAttacks(t *testing.T) {
	t.Run("guessing the init secret from one source backs off (was open)", func(t *testing.T) {
		tg := newInitTarget(t, SecretAttemptLimits{Free: 2, Backoff: time.Minute, MaxBackoff: time.Hour, Global: connlimit.Rate{Rate: 100, Burst: 100}},
			connlimit.Limits{Handshakes: connlimit.Rate{Rate: 100, Burst: 100}})
		var guesses [][]byte
		for i := range 3 {
			guess := random(t, 32)
			guesses = append(guesses, guess)
			if err := tg.init(t, "127.0.0.31", guess); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("wrong secret %d: %v, want PermissionDenied", i+1, err)
			}
		}
		// The third wrong one started a one-minute backoff: even the right
		// secret is not compared now.
		err := tg.init(t, "127.0.0.31", tg.f.secret)
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry in 1m0s") {
			t.Fatalf("the right secret during the backoff: %v, want ResourceExhausted saying when to retry", err)
		}
		// Another source is compared as usual.
		if err := tg.init(t, "127.0.0.32", random(t, 32)); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("another source: %v, want PermissionDenied", err)
		}
		tg.clock.Step(time.Minute)
		if err := tg.init(t, "127.0.0.31", random(t, 32)); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("after the backoff: %v, want the secret compared again", err)
		}
		// The fourth wrong one doubles the wait.
		if err := tg.init(t, "127.0.0.31", tg.f.secret); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry in 2m0s") {
			t.Fatalf("after a further wrong secret: %v, want a 2 min backoff", err)
		}
		tg.f.assertUnchanged(t)
		if got, want := tg.refused(t, "wrong_secret"), 5.0; got != want {
			t.Errorf("init_refused_total{wrong_secret} = %v, want %v", got, want)
		}
		if got := tg.refused(t, "source_backoff"); got != 2 {
			t.Errorf("init_refused_total{source_backoff} = %v, want 2", got)
		}
		testkit.AssertNoSecrets(t, tg.f.node.logs.String(), append(guesses, tg.f.secret))
	})

	t.Run("guessing from many sources hits the overall limit (was open)", func(t *testing.T) {
		tg := newInitTarget(t, SecretAttemptLimits{Free: 10, Backoff: time.Minute, MaxBackoff: time.Hour, Global: connlimit.Rate{Rate: 0.001, Burst: 3}},
			connlimit.Limits{Handshakes: connlimit.Rate{Rate: 100, Burst: 100}})
		for i, src := range []string{"127.0.0.41", "127.0.0.42", "127.0.0.43"} {
			if err := tg.init(t, src, random(t, 32)); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("source %d: %v, want PermissionDenied", i+1, err)
			}
		}
		if err := tg.init(t, "127.0.0.44", tg.f.secret); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "global_limit") {
			t.Fatalf("a fourth source: %v, want ResourceExhausted (global_limit)", err)
		}
		tg.f.assertUnchanged(t)
		if got := tg.refused(t, "global_limit"); got != 1 {
			t.Errorf("init_refused_total{global_limit} = %v, want 1", got)
		}
	})

	t.Run("handshake flood costs no TPM quote (was open)", func(t *testing.T) {
		tg := newInitTarget(t, DefaultSecretAttemptLimits, connlimit.Limits{Handshakes: connlimit.Rate{Rate: 0.001, Burst: 2}})
		for i := range 2 {
			if err := tg.init(t, "127.0.0.51", random(t, 32)); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("connection %d: %v, want the handshake and a PermissionDenied", i+1, err)
			}
		}
		quotes := tg.quotes.quotes.Load()
		if err := tg.init(t, "127.0.0.51", tg.f.secret); status.Code(err) != codes.Unavailable {
			t.Fatalf("third connection from one source: %v, want it closed before the handshake", err)
		}
		if got := tg.quotes.quotes.Load(); got != quotes {
			t.Errorf("the node made %d more TPM quotes for a refused connection", got-quotes)
		}
		if err := tg.init(t, "127.0.0.52", random(t, 32)); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("another source: %v, want the handshake and a PermissionDenied", err)
		}
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_connections_refused_total", connlimit.ReasonRate); got != 1 {
			t.Errorf("connections_refused_total{handshake_rate_limited} = %v, want 1", got)
		}
		tg.f.assertUnchanged(t)
	})
}
