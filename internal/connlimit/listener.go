package connlimit

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Limits of a Listener. Zero PerSource or Total means no cap.
type Limits struct {
	// Handshakes is the per-source budget of new connections; each costs
	// the server a handshake (for attested TLS, evidence to verify or a
	// TPM quote to make).
	Handshakes Rate
	// PerSource caps one source's open connections.
	PerSource int
	// Total caps all open connections.
	Total int
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
	}
	return nil
}

// Refusal reasons, also the values of the metric's reason label.
const (
	ReasonRate              = "handshake_rate_limited"
	ReasonSourceConnections = "source_connection_limit"
	ReasonTotalConnections  = "connection_limit"
)

// Options of a Listener.
type Options struct {
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// OnRefuse is called for every refused connection, e.g. to audit it.
	OnRefuse func(source, reason string)
	// Registerer registers gatehouse_<Subsystem>_connections_refused_total
	// {reason} and gatehouse_<Subsystem>_connections_open; nil registers
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
	onRefuse func(source, reason string)
	refused  *prometheus.CounterVec
	open     prometheus.Gauge

	mu       sync.Mutex
	total    int
	bySource map[string]int
}

// NewListener wraps inner: a connection over a limit is closed at once,
// before any TLS or attestation work, and counted; an accepted connection
// frees its slot when closed (Close is idempotent).
func NewListener(inner net.Listener, limits Limits, opts Options) (*Listener, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	l := &Listener{
		Listener: inner, limits: limits, buckets: NewBuckets(limits.Handshakes, opts.Now), onRefuse: opts.OnRefuse,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: opts.Subsystem, Name: "connections_refused_total",
			Help: "Connections closed on accept for exceeding a limit, by reason.",
		}, []string{"reason"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gatehouse", Subsystem: opts.Subsystem, Name: "connections_open",
			Help: "Connections accepted and not yet closed.",
		}),
		bySource: map[string]int{},
	}
	for _, r := range []string{ReasonRate, ReasonSourceConnections, ReasonTotalConnections} {
		l.refused.WithLabelValues(r)
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{l.refused, l.open} {
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
		source := Source(conn.RemoteAddr())
		if reason := l.admit(source); reason != "" {
			// Counted and reported before the close, so that a peer who
			// sees its connection closed finds the refusal recorded.
			l.refused.WithLabelValues(reason).Inc()
			if l.onRefuse != nil {
				l.onRefuse(source, reason)
			}
			_ = conn.Close()
			continue
		}
		l.open.Inc()
		return &trackedConn{Conn: conn, l: l, source: source}, nil
	}
}

// admit takes a slot for source, or returns why not.
func (l *Listener) admit(source string) string {
	if !l.buckets.Allow(source) {
		return ReasonRate
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.limits.Total > 0 && l.total >= l.limits.Total:
		return ReasonTotalConnections
	case l.limits.PerSource > 0 && l.bySource[source] >= l.limits.PerSource:
		return ReasonSourceConnections
	}
	l.total++
	l.bySource[source]++
	return ""
}

func (l *Listener) release(source string) {
	l.mu.Lock()
	l.total--
	if l.bySource[source]--; l.bySource[source] <= 0 {
		delete(l.bySource, source)
	}
	l.mu.Unlock()
	l.open.Dec()
}

type trackedConn struct {
	net.Conn
	l      *Listener
	source string
	once   sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.source) })
	return err
}
