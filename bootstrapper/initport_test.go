package bootstrapper

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	testingclock "k8s.io/utils/clock/testing"

	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	recoveryservicev1 "github.com/gatehouse-dev/gatehouse/api/recoveryservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// holdIdle opens an attested connection from source to addr, as an
// attacker holding a slot does: it completes the handshake and then sends
// nothing.
func holdIdle(t *testing.T, addr, source string, v attestation.Verifier) *grpc.ClientConn {
	t.Helper()
	conn := dialFrom(t, addr, source, atls.Config{Verifiers: []attestation.Verifier{v}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn.Connect()
	for state := conn.GetState(); state != connectivity.Ready; state = conn.GetState() {
		if !conn.WaitForStateChange(ctx, state) {
			t.Fatalf("attested connection from %s: %s, want ready", source, state)
		}
	}
	return conn
}

// gauge returns the value of gauge name in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// awaitOpen waits until the port holds n connections.
func awaitOpen(t *testing.T, reg *prometheus.Registry, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for gauge(t, reg, "gatehouse_bootstrapper_connections_open") != float64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("connections_open = %v, want %d", gauge(t, reg, "gatehouse_bootstrapper_connections_open"), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// recoveryTarget is a rebooted node whose join service is down, running
// Run with RecoveryService on the production init port (ListenInitPort,
// its clock fake), as an attacker on the network meets it.
type recoveryTarget struct {
	node   *testNode
	ticket *joinservicev1.IssueJoinTicketResponse
	run    *runFixture
	vol    *recordingVolume
	addr   string
	clock  *testingclock.FakeClock
	reg    *prometheus.Registry
	done   chan error
}

// newRecoveryTarget starts Run on a rebooted node; wrap, if given, wraps
// the state disk the recovery server tests keys against (the right key is
// the ticket's).
func newRecoveryTarget(t *testing.T, limits InitPortLimits, attempts SecretAttemptLimits,
	wrap func(bootDisk, *joinservicev1.IssueJoinTicketResponse) bootDisk) *recoveryTarget {
	t.Helper()
	ca, n, ticket := rebootedNode(t)
	f := newRunFixture(t, n, ca, "127.0.0.1:1") // the join service is down
	_ = f.cfg.InitListener.Close()              // replaced by the production port
	tg := &recoveryTarget{node: n, ticket: ticket, run: f, vol: &recordingVolume{},
		clock: testingclock.NewFakeClock(time.Now()), reg: prometheus.NewRegistry()}
	n.machine.State = tg.vol
	creds, err := atls.NewCredentials(atls.Config{Attester: n.attester})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.cfg.InitListener, f.cfg.InitGRPCServer, err = ListenInitPort(inner, InitPortConfig{
		Creds: creds, Limits: limits, Log: n.machine.Log, Registerer: tg.reg, Clock: tg.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.cfg.RecoveryAttempts, f.cfg.Registerer, f.cfg.Now = attempts, tg.reg, tg.clock.Now
	if wrap != nil {
		f.cfg.Disk = wrap(n.disk, ticket)
	}
	tg.addr = inner.Addr().String()
	tg.done = f.run(t.Context())
	return tg
}

// client returns a RecoveryService client from source that attests the
// node, as `gatehouse recover` does.
func (tg *recoveryTarget) client(t *testing.T, source string) recoveryservicev1.RecoveryServiceClient {
	t.Helper()
	return recoveryservicev1.NewRecoveryServiceClient(dialFrom(t, tg.addr, source, atls.Config{Verifiers: []attestation.Verifier{tg.verifier(t)}}))
}

func (tg *recoveryTarget) verifier(t *testing.T) attestation.Verifier {
	return verifier(t, tg.node.attester)
}

// right is the request `gatehouse recover` sends this node.
func (tg *recoveryTarget) right() *recoveryservicev1.RecoverRequest {
	return &recoveryservicev1.RecoverRequest{StateDiskKey: tg.ticket.GetStateDiskKey(), MeasurementSecret: tg.ticket.GetMeasurementSecret()}
}

// wrong is a well-formed request with a key that does not open the disk.
func (tg *recoveryTarget) wrong(t *testing.T) *recoveryservicev1.RecoverRequest {
	return &recoveryservicev1.RecoverRequest{StateDiskKey: random(t, 32), MeasurementSecret: tg.ticket.GetMeasurementSecret()}
}

// assertRecovered checks that Run ended with the node recovered once, by
// the right key.
func (tg *recoveryTarget) assertRecovered(t *testing.T) {
	t.Helper()
	if err := awaitRun(t, tg.done); err != nil {
		t.Fatal(err)
	}
	tg.vol.unlockedWith(t, tg.ticket.GetStateDiskKey())
	if tg.node.lock.Holder() != "recover" || tg.run.kubelet.restarts.Load() != 1 {
		t.Fatalf("node lock holder %q, kubelet restarts %d: want recover, 1", tg.node.lock.Holder(), tg.run.kubelet.restarts.Load())
	}
}

// TestInitPortAttacks: what an attacker on the network tries against the
// connections of the init port. Idle connections are closed, silent
// handshakes too, and sources holding every connection slot with idle
// attested connections do not keep `gatehouse init` or `gatehouse recover`
// out: the honest caller gets in at once, without waiting for any idle
// timeout (the port's clock never moves).
func TestInitPortAttacks(t *testing.T) {
	t.Run("idle attested connections and silent handshakes are closed (was open)", func(t *testing.T) {
		tg := newInitTarget(t, DefaultSecretAttemptLimits, InitPortLimits{
			Listen:           connlimit.Limits{Handshakes: connlimit.Rate{Rate: 100, Burst: 100}, MaxIdle: time.Minute},
			HandshakeTimeout: time.Second,
		})
		v := verifier(t, tg.f.node.attester)
		idle := []*grpc.ClientConn{holdIdle(t, tg.addr, "127.0.0.61", v), holdIdle(t, tg.addr, "127.0.0.61", v)}
		awaitOpen(t, tg.reg, 2)
		tg.clock.Step(time.Minute - time.Millisecond)
		if got := gauge(t, tg.reg, "gatehouse_bootstrapper_connections_open"); got != 2 {
			t.Fatalf("connections_open = %v before the idle timeout, want 2", got)
		}
		tg.clock.Step(time.Millisecond)
		awaitOpen(t, tg.reg, 0)
		for i, c := range idle {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			for c.GetState() == connectivity.Ready {
				if !c.WaitForStateChange(ctx, connectivity.Ready) {
					t.Fatalf("idle connection %d is still up on the client side", i+1)
				}
			}
			cancel()
		}
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_connections_closed_total", connlimit.ReasonIdle); got != 2 {
			t.Errorf("connections_closed_total{idle} = %v, want 2", got)
		}

		// A connection that never completes its handshake is closed by the
		// handshake timeout (the real clock's: 1 s here), well within 2×.
		raw, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.62")}}).Dial("tcp", tg.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = raw.Close() })
		start := time.Now()
		if err := raw.SetReadDeadline(start.Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Read(make([]byte, 1)); err == nil {
			t.Fatal("the node answered a connection that sent no handshake")
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("a silent handshake was closed after %s, want within 2 × the 1 s handshake timeout", took)
		}
		tg.f.assertUnchanged(t)
	})

	t.Run("idle attested connections holding every slot do not keep init out (was held shut)", func(t *testing.T) {
		tg := newInitTarget(t, DefaultSecretAttemptLimits, InitPortLimits{Listen: connlimit.Limits{
			Handshakes: connlimit.Rate{Rate: 100, Burst: 100}, PerSource: 2, Total: 6, MaxIdle: time.Minute,
		}}, recordKubeadm)
		v := verifier(t, tg.f.node.attester)
		for _, src := range []string{"127.0.0.63", "127.0.0.64", "127.0.0.65"} {
			holdIdle(t, tg.addr, src, v)
			holdIdle(t, tg.addr, src, v)
		}
		awaitOpen(t, tg.reg, 6)
		// A source at its own cap gets no further slot, not even by eviction.
		if err := tg.init(t, "127.0.0.63", tg.f.secret); status.Code(err) != codes.Unavailable {
			t.Fatalf("a third connection from a source with two: %v, want it closed before the handshake", err)
		}
		tg.f.assertUnchanged(t)
		start := tg.clock.Now()
		final, err := tg.initFinal(t, "127.0.0.70", tg.f.secret)
		if err != nil || final.GetSuccess() == nil {
			t.Fatalf("the honest init while idle connections hold every slot: %v (failure %q), want it to run", err, final.GetFailure().GetError())
		}
		if !tg.clock.Now().Equal(start) {
			t.Fatal("the port's clock moved: the init must get in without waiting for an idle timeout")
		}
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_connections_closed_total", connlimit.ReasonEvicted); got != 1 {
			t.Errorf("connections_closed_total{evicted} = %v, want 1 (the oldest idle connection)", got)
		}
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_connections_refused_total", connlimit.ReasonSourceConnections); got != 1 {
			t.Errorf("connections_refused_total{source_connection_limit} = %v, want 1", got)
		}
	})

	t.Run("an init in flight is neither evicted nor closed as idle, however long it runs", func(t *testing.T) {
		running, release := make(chan struct{}, 1), make(chan struct{})
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		tg := newInitTarget(t, DefaultSecretAttemptLimits, InitPortLimits{Listen: connlimit.Limits{
			Handshakes: connlimit.Rate{Rate: 100, Burst: 100}, Total: 2, MaxIdle: time.Minute,
		}}, recordKubeadm, func(tg *initTarget) {
			tg.f.node.runner.onRun = func(args []string) {
				if args[0] == "init" {
					running <- struct{}{}
					<-release
				}
			}
		})
		type result struct {
			final *initservicev1.InitResponse
			err   error
		}
		done := make(chan result, 1)
		honest, _ := tg.client(t, "127.0.0.66")
		go func() {
			final, err := sendInit(t.Context(), t, honest, tg.f.req, tg.f.secret)
			done <- result{final, err}
		}()
		<-running                                  // kubeadm init runs: the honest stream is in flight
		v := verifier(t, tg.f.node.attester, true) // the node lock is taken by now
		holdIdle(t, tg.addr, "127.0.0.67", v)
		// At the cap the newcomer evicts the idle connection, not the older
		// one with the init in flight.
		holdIdle(t, tg.addr, "127.0.0.68", v)
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_connections_closed_total", connlimit.ReasonEvicted); got != 1 {
			t.Fatalf("connections_closed_total{evicted} = %v, want 1", got)
		}
		tg.clock.Step(2 * time.Minute)
		awaitOpen(t, tg.reg, 1) // the idle newcomer
		close(release)
		r := <-done
		if r.err != nil || r.final.GetSuccess() == nil {
			t.Fatalf("the init in flight: %v (failure %q), want it to finish over its connection", r.err, r.final.GetFailure().GetError())
		}
	})

	t.Run("idle attested connections holding every slot do not keep recover out (was held shut)", func(t *testing.T) {
		tg := newRecoveryTarget(t, InitPortLimits{Listen: connlimit.Limits{
			Handshakes: connlimit.Rate{Rate: 100, Burst: 100}, PerSource: 2, Total: 4, MaxIdle: time.Minute,
		}}, DefaultSecretAttemptLimits, nil)
		for _, src := range []string{"127.0.0.71", "127.0.0.72"} {
			holdIdle(t, tg.addr, src, tg.verifier(t))
			holdIdle(t, tg.addr, src, tg.verifier(t))
		}
		awaitOpen(t, tg.reg, 4)
		// As gatehouse recover: both calls over one attested connection.
		client := tg.client(t, "127.0.0.75")
		if _, err := client.GetRecoveryInfo(t.Context(), &recoveryservicev1.GetRecoveryInfoRequest{}); err != nil {
			t.Fatalf("GetRecoveryInfo while idle connections hold every slot: %v", err)
		}
		if _, err := client.Recover(t.Context(), tg.right()); err != nil {
			t.Fatalf("Recover while idle connections hold every slot: %v", err)
		}
		tg.assertRecovered(t)
		if got := metric(t, tg.reg, "gatehouse_bootstrapper_connections_closed_total", connlimit.ReasonEvicted); got != 1 {
			t.Errorf("connections_closed_total{evicted} = %v, want 1", got)
		}
	})
}
