// Package connlimit bounds what network peers can make a server do before
// they are authenticated: a token bucket of new connections per source, a
// cap on each source's open connections and on all open connections. A
// connection over a limit is closed at once, before any TLS or attestation
// work (docs/threat-model.md, "Limits at every door").
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Rate is a token bucket: Burst events at once, refilled at Rate per second.
type Rate struct {
	Rate  float64
	Burst int
}

// maxSources bounds a Buckets' memory: beyond it, idle sources are dropped
// first, and if none is idle the new source is refused.
const maxSources = 1 << 16

// sourceIdle is how long a source's bucket is kept after its last event;
// by then a bucket is full again, so dropping it changes nothing.
const sourceIdle = 10 * time.Minute

// Buckets is a token bucket per source, bounded in memory. It is safe for
// concurrent use.
type Buckets struct {
	limit Rate
	now   func() time.Time

	mu      sync.Mutex
	sources map[string]*bucket
}

type bucket struct {
	limiter *rate.Limiter
	last    time.Time
}

// NewBuckets returns per-source buckets of r; now is the clock.
func NewBuckets(r Rate, now func() time.Time) *Buckets {
	return &Buckets{limit: r, now: now, sources: map[string]*bucket{}}
}

// Allow takes one event from source's bucket; false means over budget.
func (b *Buckets) Allow(source string) bool {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sources[source]
	if !ok {
		if len(b.sources) >= maxSources && !b.evictIdle(now) {
			return false
		}
		s = &bucket{limiter: rate.NewLimiter(rate.Limit(b.limit.Rate), b.limit.Burst)}
		b.sources[source] = s
	}
	s.last = now
	return s.limiter.AllowN(now, 1)
}

// evictIdle drops sources idle for sourceIdle and reports whether any was.
func (b *Buckets) evictIdle(now time.Time) bool {
	n := len(b.sources)
	for addr, s := range b.sources {
		if now.Sub(s.last) >= sourceIdle {
			delete(b.sources, addr)
		}
	}
	return len(b.sources) < n
}

// Source returns the key a peer address is limited under: the IPv4
// address, or the IPv6 /64 prefix (one host usually owns a /64, so a
// per-address limit would not bind it); "" for a nil or unparsable addr.
func Source(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		ap, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return ""
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap()
	if !ip.IsValid() {
		return ""
	}
	if ip.Is6() {
		return netip.PrefixFrom(ip, 64).Masked().String()
	}
	return ip.String()
}
