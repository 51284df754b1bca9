package connlimit

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Limits of a Listener. Zero PerSource, Total or MaxIdle means no cap.
type Limits struct {
	// Handshakes is the per-source budget of new connections; each costs
	// the server a handshake (for attested TLS, evidence to verify or a
	// TPM quote to make).
	Handshakes Rate
	// PerSource caps one source's open connections.
	PerSource int
	// Total caps all open connections.
	Total int
	// MaxIdle closes a connection that had no request in flight for this
	// long: since it was accepted (its handshake included) or since its
	// last request ended. Requests are known only through the server's
	// StatsHandler; without it every connection is closed MaxIdle after it
	// was accepted.
	MaxIdle time.Duration
	// EvictIdle makes room at the Total cap: instead of refusing the new
	// connection, the connection accepted first among those without a
	// request in flight is closed. Needs the StatsHandler on the server,
	// or connections with requests in flight are closed too.
	EvictIdle bool
}

// Validate returns an error naming the first bad limit.
func (l Limits) Validate() error {
	switch {
	case l.Handshakes.Rate <= 0:
		return fmt.Errorf("handshake rate %g per second must be positive", l.Handshakes.Rate)
	case l.Handshakes.Burst < 1:
		return fmt.Errorf("handshake burst %d must be at least 1", l.Handshakes.Burst)
	case l.PerSource < 0 || l.Total < 0:
		return errors.New("connection caps must not be negative (0 means no cap)")
	case l.MaxIdle < 0:
		return fmt.Errorf("idle timeout %s must not be negative (0 means none)", l.MaxIdle)
	}
	return nil
}

// Refusal reasons, also the values of the metric's reason label.
const (
	ReasonRate              = "handshake_rate_limited"
	ReasonSourceConnections = "source_connection_limit"
	ReasonTotalConnections  = "connection_limit"
)

// Reasons an accepted connection is closed by the Listener, also the
// values of the closed metric's reason label.
const (
	// ReasonIdle: no request in flight for Limits.MaxIdle.
	ReasonIdle = "idle"
	// ReasonEvicted: closed at the Total cap to admit a new connection
	// (Limits.EvictIdle).
	ReasonEvicted = "evicted"
)

// Options of a Listener.
type Options struct {
	// Now is the clock of the handshake budgets; nil is Clock's Now.
	Now func() time.Time
	// Clock times idle connections (Limits.MaxIdle); nil is the real clock.
	Clock clock.WithDelayedExecution
	// OnRefuse is called for every refused connection, e.g. to audit it.
	OnRefuse func(source, reason string)
	// OnClose is called for every accepted connection the Listener closes
	// (ReasonIdle, ReasonEvicted), before it is closed.
	OnClose func(source, reason string)
	// Registerer registers gatehouse_<Subsystem>_connections_refused_total
	// {reason} and gatehouse_<Subsystem>_connections_open, and with
	// Limits.MaxIdle or Limits.EvictIdle also
	// gatehouse_<Subsystem>_connections_closed_total{reason}; nil registers
	// nothing.
	Registerer prometheus.Registerer
	// Subsystem names the component in metric names, e.g. "joinservice".
	Subsystem string
}

// Listener wraps a net.Listener with Limits. It is safe for concurrent use.
type Listener struct {
	net.Listener
	limits   Limits
	buckets  *Buckets
	clock    clock.WithDelayedExecution
	onRefuse func(source, reason string)
	onClose  func(source, reason string)
	refused  *prometheus.CounterVec
	closed   *prometheus.CounterVec
	open     prometheus.Gauge

	mu       sync.Mutex
	total    int
	bySource map[string]int
	conns    map[string]*trackedConn // by connKey
}

// NewListener wraps inner: a connection over a limit is closed at once,
// before any TLS or attestation work, and counted; an accepted connection
// frees its slot when closed (Close is idempotent). With Limits.MaxIdle or
// Limits.EvictIdle, serve it with StatsHandler installed on the gRPC server.
func NewListener(inner net.Listener, limits Limits, opts Options) (*Listener, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Now == nil {
		opts.Now = opts.Clock.Now
	}
	l := &Listener{
		Listener: inner, limits: limits, buckets: NewBuckets(limits.Handshakes, opts.Now),
		clock: opts.Clock, onRefuse: opts.OnRefuse, onClose: opts.OnClose,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: opts.Subsystem, Name: "connections_refused_total",
			Help: "Connections closed on accept for exceeding a limit, by reason.",
		}, []string{"reason"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: opts.Subsystem, Name: "connections_closed_total",
			Help: "Accepted connections the server closed: idle for too long, or evicted at the connection cap, by reason.",
		}, []string{"reason"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gatehouse", Subsystem: opts.Subsystem, Name: "connections_open",
			Help: "Connections accepted and not yet closed.",
		}),
		bySource: map[string]int{},
		conns:    map[string]*trackedConn{},
	}
	for _, r := range []string{ReasonRate, ReasonSourceConnections, ReasonTotalConnections} {
		l.refused.WithLabelValues(r)
	}
	for _, r := range []string{ReasonIdle, ReasonEvicted} {
		l.closed.WithLabelValues(r)
	}
	if opts.Registerer != nil {
		collectors := []prometheus.Collector{l.refused, l.open}
		if limits.MaxIdle > 0 || limits.EvictIdle {
			collectors = append(collectors, l.closed)
		}
		for _, c := range collectors {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("registering connection metrics: %w", err)
			}
		}
	}
	return l, nil
}

// Accept returns the next connection within the limits; connections over
// a limit are closed and never returned. It fails only when the inner
// listener fails.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &trackedConn{Conn: conn, l: l, source: Source(conn.RemoteAddr()), key: connKey(conn.LocalAddr(), conn.RemoteAddr())}
		reason, evicted := l.admit(c)
		if evicted != nil {
			// Counted and reported before the close, as refusals are.
			l.closed.WithLabelValues(ReasonEvicted).Inc()
			if l.onClose != nil {
				l.onClose(evicted.source, ReasonEvicted)
			}
			_ = evicted.Conn.Close()
		}
		if reason != "" {
			// Counted and reported before the close, so that a peer who
			// sees its connection closed finds the refusal recorded.
			l.refused.WithLabelValues(reason).Inc()
			if l.onRefuse != nil {
				l.onRefuse(c.source, reason)
			}
			_ = conn.Close()
			continue
		}
		return c, nil
	}
}

// admit takes a slot for c, or returns why not; at the Total cap with
// EvictIdle it frees the slot of the connection it returns, which the
// caller closes.
func (l *Listener) admit(c *trackedConn) (reason string, evicted *trackedConn) {
	if !l.buckets.Allow(c.source) {
		return ReasonRate, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limits.PerSource > 0 && l.bySource[c.source] >= l.limits.PerSource {
		return ReasonSourceConnections, nil
	}
	if l.limits.Total > 0 && l.total >= l.limits.Total {
		if !l.limits.EvictIdle {
			return ReasonTotalConnections, nil
		}
		if evicted = l.oldestIdleLocked(); evicted == nil {
			return ReasonTotalConnections, nil
		}
		l.removeLocked(evicted)
	}
	now := l.clock.Now()
	c.accepted, c.idleSince = now, now
	l.total++
	l.bySource[c.source]++
	if c.key != "" {
		l.conns[c.key] = c
	}
	l.open.Inc()
	if l.limits.MaxIdle > 0 {
		c.timer = l.clock.AfterFunc(l.limits.MaxIdle, c.expire)
	}
	return "", evicted
}

// removeLocked frees c's slot and stops its timer, once; l.mu is held.
func (l *Listener) removeLocked(c *trackedConn) {
	if c.removed {
		return
	}
	c.removed = true
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if l.conns[c.key] == c {
		delete(l.conns, c.key)
	}
	l.total--
	if l.bySource[c.source]--; l.bySource[c.source] <= 0 {
		delete(l.bySource, c.source)
	}
	l.open.Dec()
}

type trackedConn struct {
	net.Conn
	l      *Listener
	source string
	key    string

	// Guarded by l.mu.
	removed   bool
	accepted  time.Time
	idleSince time.Time   // last time the connection became idle
	inFlight  int         // requests in flight (StatsHandler)
	timer     clock.Timer // armed while idle and MaxIdle is set
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.removeLocked(c)
	c.l.mu.Unlock()
	return err
}
