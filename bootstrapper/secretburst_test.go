package bootstrapper

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	recoveryservicev1 "github.com/gatehouse-dev/gatehouse/api/recoveryservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// gate holds every wrong secret inside its comparison until released, so
// a test can send the right one while the wrong ones are provably still
// being compared.
type gate struct {
	entered   chan struct{}
	release   chan struct{}
	once      sync.Once
	comparing atomic.Int32
}

func newGate(t *testing.T, capacity int) *gate {
	g := &gate{entered: make(chan struct{}, capacity), release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

// hold blocks a wrong secret's comparison until open or ctx ends.
func (g *gate) hold(ctx context.Context) error {
	g.comparing.Add(1)
	defer g.comparing.Add(-1)
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// await waits until n wrong secrets are being compared.
func (g *gate) await(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for range n {
		select {
		case <-g.entered:
		case <-timeout:
			t.Fatalf("%d wrong secrets are being compared, want %d", g.comparing.Load(), n)
		}
	}
}

// gatedDisk holds wrong keys at the gate before the real disk tests them.
type gatedDisk struct {
	bootDisk
	right []byte
	gate  *gate
}

func (d *gatedDisk) TestKey(ctx context.Context, key []byte) (bool, error) {
	if !bytes.Equal(key, d.right) {
		if err := d.gate.hold(ctx); err != nil {
			return false, err
		}
	}
	return d.bootDisk.TestKey(ctx, key)
}

// sources returns n source addresses from 127.0.<third>.1 on.
func sources(third, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("127.0.%d.%d", third, i+1)
	}
	return out
}

// TestSecretBursts: wrong init secrets or recovery keys sent together with
// the right one never hold it up. Each wrong one is held inside its
// comparison until the right one has been served: the right one cannot
// have waited on them. Extra attempts from a source with one in flight are
// refused at once; the refused attempts take no lock and change nothing.
func TestSecretBursts(t *testing.T) {
	// More wrong secrets than the overall budget's burst (10).
	const n = 12

	t.Run("a burst of wrong init secrets does not hold up the right one (was held shut)", func(t *testing.T) {
		g := newGate(t, n+3)
		tg := newInitTarget(t, DefaultSecretAttemptLimits, InitPortLimits{Listen: connlimit.Limits{Handshakes: connlimit.Rate{Rate: 100, Burst: 100}}},
			recordKubeadm, func(tg *initTarget) {
				compare := tg.f.server.compare
				tg.f.server.compare = func(secret []byte) bool {
					if !bytes.Equal(secret, tg.f.secret) {
						_ = g.hold(context.Background())
					}
					return compare(secret)
				}
			})
		var clients []initservicev1.InitServiceClient
		for _, src := range sources(1, n) {
			c, _ := tg.client(t, src)
			clients = append(clients, c)
		}
		multiplexed, _ := tg.client(t, "127.0.2.1") // one connection, several attempts
		results := make(chan error, n+1)
		var guesses [][]byte
		send := func(c initservicev1.InitServiceClient) {
			guess := random(t, 32)
			guesses = append(guesses, guess)
			go func() {
				_, err := sendInit(t.Context(), t, c, tg.f.req, guess)
				results <- err
			}()
		}
		for _, c := range clients {
			send(c)
		}
		g.await(t, n)
		send(multiplexed)
		g.await(t, 1)
		for i := range 2 {
			_, err := sendInit(t.Context(), t, multiplexed, tg.f.req, random(t, 32))
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "source_busy") {
				t.Fatalf("attempt %d beside one in flight from the same source: %v, want ResourceExhausted (source_busy) at once", i+2, err)
			}
		}

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		honest, _ := tg.client(t, "127.0.3.1")
		final, err := sendInit(ctx, t, honest, tg.f.req, tg.f.secret)
		if err != nil || final.GetSuccess() == nil {
			t.Fatalf("the right secret during the burst: %v (failure %q), want the init to run", err, final.GetFailure().GetError())
		}
		if got := g.comparing.Load(); got != n+1 {
			t.Fatalf("%d wrong secrets still being compared when the right one was served, want all %d", got, n+1)
		}
		g.open()
		for range n + 1 {
			if err := <-results; status.Code(err) != codes.PermissionDenied {
				t.Fatalf("a wrong secret of the burst: %v, want PermissionDenied", err)
			}
		}
		if got := tg.refused(t, "wrong_secret"); got != n+1 {
			t.Errorf("init_refused_total{wrong_secret} = %v, want %d", got, n+1)
		}
		if got := tg.refused(t, "source_busy"); got != 2 {
			t.Errorf("init_refused_total{source_busy} = %v, want 2", got)
		}
		// The refused attempts left nothing behind: no comparison marked in
		// flight, and the init ran once.
		tg.f.server.attempts.mu.Lock()
		for src, s := range tg.f.server.attempts.sources {
			if s.inFlight {
				t.Errorf("source %s still has a comparison in flight", src)
			}
		}
		tg.f.server.attempts.mu.Unlock()
		if got := tg.f.node.runner.subcommands(); got != "init,token" {
			t.Errorf("kubeadm ran %s, want one init", got)
		}
		testkit.AssertNoSecrets(t, tg.f.node.logs.String(), append(guesses, tg.f.secret))
	})

	t.Run("a burst of wrong recovery keys does not hold up the right one (was held shut)", func(t *testing.T) {
		g := newGate(t, n+3)
		tg := newRecoveryTarget(t, InitPortLimits{Listen: connlimit.Limits{Handshakes: connlimit.Rate{Rate: 100, Burst: 100}}}, DefaultSecretAttemptLimits,
			func(d bootDisk, ticket *joinservicev1.IssueJoinTicketResponse) bootDisk {
				return &gatedDisk{bootDisk: d, right: ticket.GetStateDiskKey(), gate: g}
			})
		var clients []recoveryservicev1.RecoveryServiceClient
		for _, src := range sources(4, n) {
			clients = append(clients, tg.client(t, src))
		}
		multiplexed := tg.client(t, "127.0.5.1")
		results := make(chan error, n+1)
		send := func(c recoveryservicev1.RecoveryServiceClient) {
			req := tg.wrong(t)
			go func() {
				_, err := c.Recover(t.Context(), req)
				results <- err
			}()
		}
		for _, c := range clients {
			send(c)
		}
		g.await(t, n)
		send(multiplexed)
		g.await(t, 1)
		for i := range 2 {
			if _, err := multiplexed.Recover(t.Context(), tg.wrong(t)); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "source_busy") {
				t.Fatalf("attempt %d beside one in flight from the same source: %v, want ResourceExhausted (source_busy) at once", i+2, err)
			}
		}

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if _, err := tg.client(t, "127.0.6.1").Recover(ctx, tg.right()); err != nil {
			t.Fatalf("the right key during the burst: %v, want the node recovered", err)
		}
		if got := g.comparing.Load(); got != n+1 {
			t.Fatalf("%d wrong keys still being tested when the right one was served, want all %d", got, n+1)
		}
		g.open()
		for range n + 1 {
			if err := <-results; status.Code(err) != codes.InvalidArgument {
				t.Fatalf("a wrong key of the burst: %v, want InvalidArgument", err)
			}
		}
		// The wrong keys changed nothing: the node was unlocked once, with
		// the right key, and its lock holds the right cluster ID.
		tg.assertRecovered(t)
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_recover_refused_total", "wrong_key"); got != n+1 {
			t.Errorf("recover_refused_total{wrong_key} = %v, want %d", got, n+1)
		}
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_recover_refused_total", "source_busy"); got != 2 {
			t.Errorf("recover_refused_total{source_busy} = %v, want 2", got)
		}
	})

	t.Run("wrong recovery keys from one source back off; another source is not delayed (was open)", func(t *testing.T) {
		tg := newRecoveryTarget(t, InitPortLimits{Listen: connlimit.Limits{Handshakes: connlimit.Rate{Rate: 100, Burst: 100}}},
			SecretAttemptLimits{Free: 1, Backoff: time.Minute, MaxBackoff: time.Hour, Global: connlimit.Rate{Rate: 100, Burst: 100}}, nil)
		guesser := tg.client(t, "127.0.7.1")
		for i := range 2 {
			if _, err := guesser.Recover(t.Context(), tg.wrong(t)); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("wrong key %d: %v, want InvalidArgument", i+1, err)
			}
		}
		_, err := guesser.Recover(t.Context(), tg.right())
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry in 1m0s") {
			t.Fatalf("the right key from a source backing off: %v, want ResourceExhausted saying when to retry", err)
		}
		if tg.node.lock.Locked() {
			t.Fatal("a refused attempt took the node lock")
		}
		if _, err := tg.client(t, "127.0.7.2").Recover(t.Context(), tg.right()); err != nil {
			t.Fatalf("the right key from another source: %v", err)
		}
		tg.assertRecovered(t)
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_recover_refused_total", "source_backoff"); got != 1 {
			t.Errorf("recover_refused_total{source_backoff} = %v, want 1", got)
		}
		testkit.AssertNoSecrets(t, tg.node.logs.String(), [][]byte{tg.ticket.GetStateDiskKey(), tg.ticket.GetMeasurementSecret()})
	})
}
