package bootstrapper

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// SecretAttemptLimits bound guessing the init secret, and recovery keys
// on a rebooted node. bcrypt makes each guess slow; these make guesses few
// without letting guesses keep out the right secret:
//
//   - A source compares one secret at a time; another attempt while its
//     comparison runs is refused at once (source_busy), so one connection
//     cannot run comparisons in parallel.
//   - After Free wrong secrets from a source, its next attempt is compared
//     only Backoff·2^(k-1) after its k-th wrong one beyond Free (at most
//     MaxBackoff later); a right secret clears its source.
//   - Across all sources, Global (a token bucket) is the budget of
//     comparisons with free attempts. Past it, a source is still compared
//     (so many sources guessing cannot refuse the right secret from
//     another), but its next wrong secret starts its backoff at once: each
//     address then guesses once per backoff.
//
// No comparison holds a lock another source's comparison needs.
type SecretAttemptLimits struct {
	Free       int
	Backoff    time.Duration
	MaxBackoff time.Duration
	Global     connlimit.Rate
}

// DefaultSecretAttemptLimits are 3 free tries, then waits of 1 s, 2 s,
// 4 s … up to 10 min per source; free tries for 1 comparison per second
// overall, 10 at once.
var DefaultSecretAttemptLimits = SecretAttemptLimits{
	Free: 3, Backoff: time.Second, MaxBackoff: 10 * time.Minute,
	Global: connlimit.Rate{Rate: 1, Burst: 10},
}

func (l SecretAttemptLimits) validate() error {
	if l.Free < 0 || l.Backoff <= 0 || l.MaxBackoff < l.Backoff || l.Global.Rate <= 0 || l.Global.Burst < 1 {
		return fmt.Errorf("secret attempt limits %+v: free must be ≥ 0, 0 < backoff ≤ max backoff, and the global rate positive with a burst ≥ 1", l)
	}
	return nil
}

// maxAttemptSources bounds the per-source memory of secretAttempts (beyond
// it only sources with a comparison in flight are kept, at most one per
// open connection).
const maxAttemptSources = 4096

// Refusal reasons of secretAttempts, also metric label values.
const (
	reasonSourceBackoff = "source_backoff"
	reasonSourceBusy    = "source_busy"
)

// attemptMetric names a door's refusal counter: gatehouse_bootstrapper_<name>
// {reason}, with wrong the reason of a wrong secret.
type attemptMetric struct {
	name, help, wrong string
}

var (
	initAttemptMetric = attemptMetric{
		name: "init_refused_total", wrong: "wrong_secret",
		help: "Init requests refused, by reason: wrong_secret, source_backoff, source_busy.",
	}
	recoverAttemptMetric = attemptMetric{
		name: "recover_refused_total", wrong: "wrong_key",
		help: "Recover requests refused, by reason: wrong_key, source_backoff, source_busy.",
	}
)

// secretAttempts applies SecretAttemptLimits. Every admitted comparison
// (begin) ends with right, wrong or abandon. It is safe for concurrent use.
type secretAttempts struct {
	limits  SecretAttemptLimits
	now     func() time.Time
	global  *rate.Limiter
	wrongR  string
	refused *prometheus.CounterVec

	mu      sync.Mutex
	sources map[string]*attemptState
}

type attemptState struct {
	wrong    int
	next     time.Time // no comparison before
	inFlight bool      // a comparison runs
	noFree   bool      // compared past the global budget: no free attempt left
}

func newSecretAttempts(l SecretAttemptLimits, now func() time.Time, reg prometheus.Registerer, m attemptMetric) (*secretAttempts, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	a := &secretAttempts{
		limits: l, now: now, sources: map[string]*attemptState{}, wrongR: m.wrong,
		global: rate.NewLimiter(rate.Limit(l.Global.Rate), l.Global.Burst),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "bootstrapper", Name: m.name, Help: m.help,
		}, []string{"reason"}),
	}
	for _, r := range []string{m.wrong, reasonSourceBackoff, reasonSourceBusy} {
		a.refused.WithLabelValues(r)
	}
	if reg != nil {
		if err := reg.Register(a.refused); err != nil {
			return nil, fmt.Errorf("registering %s: %w", m.name, err)
		}
	}
	return a, nil
}

// begin admits one comparison of source's secret now, or returns the
// reason it is refused and how long to wait (0: until its comparison in
// flight ends).
func (a *secretAttempts) begin(source string) (reason string, wait time.Duration) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sources[source]
	switch {
	case ok && now.Before(s.next):
		a.refused.WithLabelValues(reasonSourceBackoff).Inc()
		return reasonSourceBackoff, s.next.Sub(now)
	case ok && s.inFlight:
		a.refused.WithLabelValues(reasonSourceBusy).Inc()
		return reasonSourceBusy, 0
	case !ok:
		if len(a.sources) >= maxAttemptSources {
			a.evict(now)
		}
		s = &attemptState{}
		a.sources[source] = s
	}
	s.inFlight = true
	s.noFree = !a.global.AllowN(now, 1)
	return "", 0
}

// right clears source after a right secret.
func (a *secretAttempts) right(source string) {
	a.mu.Lock()
	delete(a.sources, source)
	a.mu.Unlock()
}

// abandon ends source's comparison without a verdict (it failed).
func (a *secretAttempts) abandon(source string) {
	a.mu.Lock()
	if s, ok := a.sources[source]; ok {
		s.inFlight = false
	}
	a.mu.Unlock()
}

// wrong records a wrong secret from source and starts its backoff once
// its free attempts are used.
func (a *secretAttempts) wrong(source string) {
	now := a.now()
	a.refused.WithLabelValues(a.wrongR).Inc()
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sources[source]
	if !ok { // evicted meanwhile
		s = &attemptState{}
		a.sources[source] = s
	}
	s.inFlight = false
	s.wrong++
	k := s.wrong - a.limits.Free
	if s.noFree {
		k = max(k, 1)
	}
	if k > 0 {
		backoff := a.limits.MaxBackoff
		if k < 32 {
			backoff = min(a.limits.Backoff<<(k-1), a.limits.MaxBackoff)
		}
		s.next = now.Add(backoff)
	}
}

// evict drops sources whose backoff has passed; when none has, the oldest
// deadline goes. Sources with a comparison in flight stay.
func (a *secretAttempts) evict(now time.Time) {
	var oldest string
	for src, s := range a.sources {
		switch {
		case s.inFlight:
		case !now.Before(s.next):
			delete(a.sources, src)
		case oldest == "" || s.next.Before(a.sources[oldest].next):
			oldest = src
		}
	}
	if len(a.sources) >= maxAttemptSources && oldest != "" {
		delete(a.sources, oldest)
	}
}
