package connlimit

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testingclock "k8s.io/utils/clock/testing"
)

// grpcServer is a gRPC server (the health service: Check is a request
// that ends at once, Watch one that stays in flight) on a limited
// loopback listener with the StatsHandler, timed by a fake clock.
type grpcServer struct {
	lis   *Listener
	clock *testingclock.FakeClock

	mu      sync.Mutex
	closed  []string // "source reason"
	refused []string
}

func newGRPCServer(t *testing.T, limits Limits) *grpcServer {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &grpcServer{clock: testingclock.NewFakeClock(time.Now())}
	s.lis, err = NewListener(inner, limits, Options{
		Clock: s.clock, Registerer: prometheus.NewRegistry(), Subsystem: "test",
		OnClose: func(source, reason string) {
			s.mu.Lock()
			s.closed = append(s.closed, source+" "+reason)
			s.mu.Unlock()
		},
		OnRefuse: func(source, reason string) {
			s.mu.Lock()
			s.refused = append(s.refused, source+" "+reason)
			s.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.StatsHandler(s.lis.StatsHandler()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(s.lis) }()
	t.Cleanup(srv.Stop)
	return s
}

// connect returns a client connected from source, once its connection is
// up and has served one request (so the server saw its handshake end).
func (s *grpcServer) connect(t *testing.T, source string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	conn, err := grpc.NewClient(s.lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn.Connect()
	for state := conn.GetState(); state != connectivity.Ready; state = conn.GetState() {
		if !conn.WaitForStateChange(ctx, state) {
			t.Fatalf("connection from %s: %s, want ready", source, state)
		}
	}
	check(t, conn)
	return conn
}

// watch starts a request that stays in flight until cancel is called,
// returning once the server's handler runs.
func watch(t *testing.T, conn *grpc.ClientConn) (cancel func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return cancel
}

func check(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}

// awaitOpen waits until the listener holds n connections.
func (s *grpcServer) awaitOpen(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(s.lis.open) != float64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("connections_open = %v, want %d", testutil.ToFloat64(s.lis.open), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (s *grpcServer) closedList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(slices.Values(s.closed))
}

// TestIdleConnectionsAreClosed: a connection without a request in flight
// for MaxIdle is closed, whether it never completed its handshake, never
// sent a request, or finished its last one MaxIdle ago; a connection with
// a request in flight is not, however long the request runs.
func TestIdleConnectionsAreClosed(t *testing.T) {
	const idle = time.Minute
	s := newGRPCServer(t, Limits{Handshakes: Rate{Rate: 100, Burst: 100}, MaxIdle: idle})
	s.connect(t, "127.0.0.31")          // one request, then nothing
	busy := s.connect(t, "127.0.0.32")  // a request in flight throughout
	asked := s.connect(t, "127.0.0.33") // another request half-way
	// .34 never completes its handshake.
	raw, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.34")}}).Dial("tcp", s.lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	stopWatch := watch(t, busy)
	s.awaitOpen(t, 4)

	s.clock.Step(idle / 2)
	check(t, asked)
	s.clock.Step(idle/2 - time.Millisecond)
	if got := s.closedList(); len(got) != 0 {
		t.Fatalf("closed before MaxIdle: %v", got)
	}
	s.clock.Step(time.Millisecond)
	s.awaitOpen(t, 2)
	if got, want := s.closedList(), []string{"127.0.0.31 idle", "127.0.0.34 idle"}; !slices.Equal(got, want) {
		t.Fatalf("closed %v, want %v", got, want)
	}
	s.clock.Step(idle / 2)
	s.awaitOpen(t, 1)
	if got := s.closedList(); !slices.Contains(got, "127.0.0.33 idle") || slices.Contains(got, "127.0.0.32 idle") {
		t.Fatalf("closed %v: want the connection idle since its request, not the one with a request in flight", got)
	}
	// The request in flight for longer than MaxIdle still runs; once it
	// ends its connection is idle, and closed MaxIdle later.
	check(t, busy)
	stopWatch()
	s.awaitIdle(t, "127.0.0.32")
	s.clock.Step(idle)
	s.awaitOpen(t, 0)
	if got := testutil.ToFloat64(s.lis.closed.WithLabelValues(ReasonIdle)); got != 4 {
		t.Errorf("connections_closed_total{idle} = %v, want 4", got)
	}
}

// awaitIdle waits until source's connection has no request in flight.
func (s *grpcServer) awaitIdle(t *testing.T, source string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.lis.mu.Lock()
		busy := false
		for _, c := range s.lis.conns {
			busy = busy || (c.source == source && c.inFlight > 0)
		}
		s.lis.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the request from %s is still in flight", source)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEvictionAtTheCap: at the total cap a new connection is admitted by
// closing the connection accepted first among those without a request in
// flight; when every connection has a request in flight, the new one is
// refused.
func TestEvictionAtTheCap(t *testing.T) {
	s := newGRPCServer(t, Limits{Handshakes: Rate{Rate: 100, Burst: 100}, Total: 2, EvictIdle: true})
	first := s.connect(t, "127.0.0.41")
	s.clock.Step(time.Millisecond)
	watch(t, s.connect(t, "127.0.0.42")) // a request in flight, never evicted
	s.clock.Step(time.Millisecond)
	// .41 is the most recently idle, but the oldest: age decides, so
	// cheap requests cannot keep a connection from eviction.
	check(t, first)
	s.connect(t, "127.0.0.43")
	s.awaitOpen(t, 2)
	if got, want := s.closedList(), []string{"127.0.0.41 evicted"}; !slices.Equal(got, want) {
		t.Fatalf("closed %v, want %v", got, want)
	}
	s.clock.Step(time.Millisecond)
	watch(t, s.connect(t, "127.0.0.44"))
	if got, want := s.closedList(), []string{"127.0.0.41 evicted", "127.0.0.43 evicted"}; !slices.Equal(got, want) {
		t.Fatalf("closed %v, want %v", got, want)
	}
	// Both connections have requests in flight: nothing to evict.
	raw, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.45")}}).Dial("tcp", s.lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	if err := raw.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection over the cap was served while every connection had a request in flight")
	}
	s.mu.Lock()
	refused := s.refused
	s.mu.Unlock()
	if want := []string{"127.0.0.45 " + ReasonTotalConnections}; !slices.Equal(refused, want) {
		t.Errorf("refused %v, want %v", refused, want)
	}
	if got := testutil.ToFloat64(s.lis.closed.WithLabelValues(ReasonEvicted)); got != 2 {
		t.Errorf("connections_closed_total{evicted} = %v, want 2", got)
	}
	s.awaitOpen(t, 2)
}

// TestIdleLimitsOff: without MaxIdle and EvictIdle nothing is closed and
// the closed metric is not registered (the join service and key service
// listeners keep their metrics).
func TestIdleLimitsOff(t *testing.T) {
	reg := prometheus.NewRegistry()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis, err := NewListener(inner, Limits{Handshakes: Rate{Rate: 1, Burst: 1}}, Options{Registerer: reg, Subsystem: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "gatehouse_test_connections_closed_total" {
			t.Fatal("connections_closed_total registered without idle limits")
		}
	}
	if err := (Limits{Handshakes: Rate{Rate: 1, Burst: 1}, MaxIdle: -time.Second}).Validate(); err == nil {
		t.Error("a negative MaxIdle validated")
	}
}
