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

	"google.golang.org/protobuf/proto"

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

// initTarget is a node's InitServer on the production init port
// (ListenInitPort, its clock fake), as an attacker on the network meets it.
type initTarget struct {
	f      *initFixture
	addr   string
	clock  *testingclock.FakeClock
	reg    *prometheus.Registry
	quotes *quoteCounter
}

// newInitTarget serves f's InitServer with attempts on a port with limits;
// prepare, if given, adjusts the target before it serves.
func newInitTarget(t *testing.T, attempts SecretAttemptLimits, limits InitPortLimits, prepare ...func(*initTarget)) *initTarget {
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
	for _, p := range prepare {
		p(tg)
	}
	creds, err := atls.NewCredentials(atls.Config{Attester: tg.quotes})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis, srv, err := ListenInitPort(inner, InitPortConfig{Creds: creds, Limits: limits, Log: f.node.machine.Log, Registerer: tg.reg, Clock: tg.clock})
	if err != nil {
		t.Fatal(err)
	}
	initservicev1.RegisterInitServiceServer(srv, f.server)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	tg.addr = inner.Addr().String()
	return tg
}

// dialFrom returns a client of addr whose connections come from source,
// with attested TLS config c.
func dialFrom(t *testing.T, addr, source string, c atls.Config) *grpc.ClientConn {
	t.Helper()
	creds, err := atls.NewCredentials(c)
	if err != nil {
		t.Fatal(err)
	}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// client returns an InitService client from source that attests the node.
func (tg *initTarget) client(t *testing.T, source string) (initservicev1.InitServiceClient, *grpc.ClientConn) {
	t.Helper()
	conn := dialFrom(t, tg.addr, source, atls.Config{Verifiers: []attestation.Verifier{verifier(t, tg.f.node.attester)}})
	return initservicev1.NewInitServiceClient(conn), conn
}

// init sends an Init with secret from source and returns the stream's
// error.
func (tg *initTarget) init(t *testing.T, source string, secret []byte) error {
	t.Helper()
	_, err := tg.initFinal(t, source, secret)
	return err
}

// initFinal sends an Init with secret from source over a new connection
// and returns the final message.
func (tg *initTarget) initFinal(t *testing.T, source string, secret []byte) (*initservicev1.InitResponse, error) {
	t.Helper()
	client, _ := tg.client(t, source)
	return sendInit(t.Context(), t, client, tg.f.req, secret)
}

// sendInit sends req with secret through client and returns the final
// message. It does not fail t, so it can run in any goroutine.
func sendInit(ctx context.Context, t *testing.T, client initservicev1.InitServiceClient, req *initservicev1.InitRequest, secret []byte) (*initservicev1.InitResponse, error) {
	req = proto.CloneOf(req)
	req.InitSecret = secret
	stream, err := client.Init(ctx, req)
	if err != nil {
		return nil, err
	}
	_, final, err := receive(t, stream)
	return final, err
}

// recordKubeadm makes the target's init job record kubeadm instead of
// running it (no Kubernetes binaries needed).
func recordKubeadm(tg *initTarget) { tg.f.node.runner.recordOnly = true }

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
			InitPortLimits{Listen: connlimit.Limits{Handshakes: connlimit.Rate{Rate: 100, Burst: 100}}})
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

	t.Run("guessing from many sources past the overall budget: each source once per backoff, the right secret still in (was held shut)", func(t *testing.T) {
		tg := newInitTarget(t, SecretAttemptLimits{Free: 10, Backoff: time.Minute, MaxBackoff: time.Hour, Global: connlimit.Rate{Rate: 0.001, Burst: 3}},
			InitPortLimits{Listen: connlimit.Limits{Handshakes: connlimit.Rate{Rate: 100, Burst: 100}}}, recordKubeadm)
		for i, src := range []string{"127.0.0.41", "127.0.0.42", "127.0.0.43", "127.0.0.41"} {
			if err := tg.init(t, src, random(t, 32)); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("attempt %d: %v, want PermissionDenied", i+1, err)
			}
		}
		// Past the budget .41's wrong secret started its backoff, though
		// it had free attempts left; so does a new source's first.
		if err := tg.init(t, "127.0.0.44", random(t, 32)); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("a fourth source: %v, want its secret compared", err)
		}
		for _, src := range []string{"127.0.0.41", "127.0.0.44"} {
			if err := tg.init(t, src, tg.f.secret); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry in 1m0s") {
				t.Fatalf("%s after a wrong secret past the budget: %v, want ResourceExhausted (source_backoff)", src, err)
			}
		}
		tg.f.assertUnchanged(t)
		if got := tg.refused(t, "source_backoff"); got != 2 {
			t.Errorf("init_refused_total{source_backoff} = %v, want 2", got)
		}
		// The guesses do not keep the right secret out.
		final, err := tg.initFinal(t, "127.0.0.45", tg.f.secret)
		if err != nil || final.GetSuccess() == nil {
			t.Fatalf("the right secret past the budget: %v (failure %q), want the init to run", err, final.GetFailure().GetError())
		}
	})

	t.Run("handshake flood costs no TPM quote (was open)", func(t *testing.T) {
		tg := newInitTarget(t, DefaultSecretAttemptLimits, InitPortLimits{Listen: connlimit.Limits{Handshakes: connlimit.Rate{Rate: 0.001, Burst: 2}}})
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
