package connlimit

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"
)

// server accepts on a limited loopback listener and records every
// connection the wrapped server sees.
type server struct {
	lis     *Listener
	reg     *prometheus.Registry
	clock   *testingclock.FakeClock
	mu      sync.Mutex
	seen    []net.Conn
	refused []string
}

func newServer(t *testing.T, limits Limits) *server {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{reg: prometheus.NewRegistry(), clock: testingclock.NewFakeClock(time.Now())}
	s.lis, err = NewListener(inner, limits, Options{
		Now: s.clock.Now, Registerer: s.reg, Subsystem: "test",
		OnRefuse: func(source, reason string) {
			s.mu.Lock()
			s.refused = append(s.refused, source+" "+reason)
			s.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.lis.Close() })
	go func() {
		for {
			c, err := s.lis.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.seen = append(s.seen, c)
			s.mu.Unlock()
			_, _ = c.Write([]byte{1}) // tell the client it was accepted
		}
	}()
	return s
}

// dial connects from source and reports whether the server accepted the
// connection (it writes one byte) or closed it at once.
func (s *server) dial(t *testing.T, source string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	c, err := d.Dial("tcp", s.lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	_, err = io.ReadFull(c, b)
	return c, err == nil
}

func (s *server) seenCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

func TestListener(t *testing.T) {
	tests := []struct {
		name   string
		limits Limits
		// dials are the sources connecting in order; accepted says which
		// the wrapped server must see.
		dials    []string
		accepted []bool
		reason   string
	}{
		{
			name:     "a source over its handshake burst is refused, another source is not",
			limits:   Limits{Handshakes: Rate{Rate: 0.001, Burst: 2}},
			dials:    []string{"127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.3"},
			accepted: []bool{true, true, false, true},
			reason:   ReasonRate,
		},
		{
			name:     "a source over its open connections is refused",
			limits:   Limits{Handshakes: Rate{Rate: 100, Burst: 100}, PerSource: 2},
			dials:    []string{"127.0.0.4", "127.0.0.4", "127.0.0.4", "127.0.0.5"},
			accepted: []bool{true, true, false, true},
			reason:   ReasonSourceConnections,
		},
		{
			name:     "all sources together over the total are refused",
			limits:   Limits{Handshakes: Rate{Rate: 100, Burst: 100}, Total: 2},
			dials:    []string{"127.0.0.6", "127.0.0.7", "127.0.0.8"},
			accepted: []bool{true, true, false},
			reason:   ReasonTotalConnections,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, tt.limits)
			want := 0
			for i, src := range tt.dials {
				_, ok := s.dial(t, src)
				if ok != tt.accepted[i] {
					t.Fatalf("dial %d from %s accepted = %t, want %t", i, src, ok, tt.accepted[i])
				}
				if ok {
					want++
				}
			}
			if got := s.seenCount(); got != want {
				t.Errorf("the wrapped server saw %d connections, want %d", got, want)
			}
			if got := testutil.ToFloat64(s.lis.refused.WithLabelValues(tt.reason)); got != 1 {
				t.Errorf("connections_refused_total{reason=%q} = %v, want 1", tt.reason, got)
			}
			if got := testutil.ToFloat64(s.lis.open); got != float64(want) {
				t.Errorf("connections_open = %v, want %d", got, want)
			}
			s.mu.Lock()
			refused := s.refused
			s.mu.Unlock()
			if len(refused) != 1 {
				t.Errorf("OnRefuse calls %v, want one", refused)
			}
		})
	}
}

// TestSlotsAndBucketsRefill: closing a connection frees its slot, and a
// source's handshake budget refills with time.
func TestSlotsAndBucketsRefill(t *testing.T) {
	s := newServer(t, Limits{Handshakes: Rate{Rate: 1, Burst: 1}, PerSource: 1})
	if _, ok := s.dial(t, "127.0.0.9"); !ok {
		t.Fatal("first connection refused")
	}
	if _, ok := s.dial(t, "127.0.0.9"); ok {
		t.Fatal("second connection within the burst accepted")
	}
	s.clock.Step(time.Second)
	if _, ok := s.dial(t, "127.0.0.9"); ok {
		t.Fatal("accepted while the first connection still holds the source's only slot")
	}
	s.mu.Lock()
	first := s.seen[0]
	s.mu.Unlock()
	_ = first.Close()
	_ = first.Close() // idempotent: frees the slot once
	s.clock.Step(time.Second)
	if _, ok := s.dial(t, "127.0.0.9"); !ok {
		t.Fatal("refused after the slot was freed and the bucket refilled")
	}
	if got := testutil.ToFloat64(s.lis.open); got != 1 {
		t.Errorf("connections_open = %v, want 1", got)
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, l := range []Limits{
		{Handshakes: Rate{Rate: 0, Burst: 1}},
		{Handshakes: Rate{Rate: 1, Burst: 0}},
		{Handshakes: Rate{Rate: 1, Burst: 1}, PerSource: -1},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", l)
		}
	}
}

func TestSource(t *testing.T) {
	for _, tt := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 4}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 4}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 4}, "2001:db8:1:2::/64"},
		{&net.UnixAddr{Name: "@x", Net: "unix"}, ""},
		{nil, ""},
	} {
		if got := Source(tt.addr); got != tt.want {
			t.Errorf("Source(%v) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// FuzzSource checks Source on arbitrary address strings.
func FuzzSource(f *testing.F) {
	f.Add("192.0.2.1:80")
	f.Add("[2001:db8::1]:443")
	f.Fuzz(func(t *testing.T, s string) {
		got := Source(fakeAddr(s))
		if got != "" && len(got) > len(s)+8 {
			t.Fatalf("Source(%q) = %q", s, got)
		}
	})
}

type fakeAddr string

func (a fakeAddr) Network() string { return "tcp" }
func (a fakeAddr) String() string  { return string(a) }
