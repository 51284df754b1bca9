package joinservice

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is the per-source request budget: a token bucket of Burst
// requests refilled at Rate per second.
type RateLimit struct {
	Rate  float64
	Burst int
}

// maxSources bounds the limiter's memory: beyond it, idle sources are
// dropped first, and if none is idle the new source is refused.
const maxSources = 1 << 16

// sourceIdle is how long a source's bucket is kept after its last request;
// by then a bucket is full again, so dropping it changes nothing.
const sourceIdle = 10 * time.Minute

// limiter is a token bucket per source address. It is safe for concurrent
// use.
type limiter struct {
	limit RateLimit
	now   func() time.Time

	mu      sync.Mutex
	sources map[string]*source
}

type source struct {
	bucket *rate.Limiter
	last   time.Time
}

func newLimiter(limit RateLimit, now func() time.Time) *limiter {
	return &limiter{limit: limit, now: now, sources: map[string]*source{}}
}

// allow takes one request from addr's bucket; false means over budget.
func (l *limiter) allow(addr string) bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.sources[addr]
	if !ok {
		if len(l.sources) >= maxSources && !l.evictIdle(now) {
			return false
		}
		s = &source{bucket: rate.NewLimiter(rate.Limit(l.limit.Rate), l.limit.Burst)}
		l.sources[addr] = s
	}
	s.last = now
	return s.bucket.AllowN(now, 1)
}

// evictIdle drops sources idle for sourceIdle and reports whether any was.
func (l *limiter) evictIdle(now time.Time) bool {
	n := len(l.sources)
	for addr, s := range l.sources {
		if now.Sub(s.last) >= sourceIdle {
			delete(l.sources, addr)
		}
	}
	return len(l.sources) < n
}
