package bootstrapper

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// SecretAttemptLimits bound guessing the init secret. bcrypt makes each
// guess slow; these make guesses few. After Free wrong secrets from a
// source, its next attempt is compared only Backoff·2^(k-1) after its k-th
// wrong one beyond Free (at most MaxBackoff later); across all sources,
// secrets are compared at most Global per second (a token bucket), so many
// sources cannot guess in parallel. A right secret clears its source.
type SecretAttemptLimits struct {
	Free       int
	Backoff    time.Duration
	MaxBackoff time.Duration
	Global     connlimit.Rate
}

// DefaultSecretAttemptLimits are 3 free tries, then waits of 1 s, 2 s,
// 4 s … up to 10 min per source; 1 comparison per second overall, 10 at
// once.
var DefaultSecretAttemptLimits = SecretAttemptLimits{
	Free: 3, Backoff: time.Second, MaxBackoff: 10 * time.Minute,
	Global: connlimit.Rate{Rate: 1, Burst: 10},
}

func (l SecretAttemptLimits) validate() error {
	if l.Free < 0 || l.Backoff <= 0 || l.MaxBackoff < l.Backoff || l.Global.Rate <= 0 || l.Global.Burst < 1 {
		return fmt.Errorf("init secret attempt limits %+v: free must be ≥ 0, 0 < backoff ≤ max backoff, and the global rate positive with a burst ≥ 1", l)
	}
	return nil
}

// maxAttemptSources bounds the per-source memory of secretAttempts.
const maxAttemptSources = 4096

// secretAttempts applies SecretAttemptLimits. It is safe for concurrent use.
type secretAttempts struct {
	limits  SecretAttemptLimits
	now     func() time.Time
	global  *rate.Limiter
	refused *prometheus.CounterVec

	mu      sync.Mutex
	sources map[string]*attemptState
}

type attemptState struct {
	wrong int
	next  time.Time // no comparison before
}

func newSecretAttempts(l SecretAttemptLimits, now func() time.Time, reg prometheus.Registerer) (*secretAttempts, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	a := &secretAttempts{
		limits: l, now: now, sources: map[string]*attemptState{},
		global: rate.NewLimiter(rate.Limit(l.Global.Rate), l.Global.Burst),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "bootstrapper", Name: "init_refused_total",
			Help: "Init requests refused, by reason: wrong_secret, source_backoff, global_limit.",
		}, []string{"reason"}),
	}
	for _, r := range []string{"wrong_secret", "source_backoff", "global_limit"} {
		a.refused.WithLabelValues(r)
	}
	if reg != nil {
		if err := reg.Register(a.refused); err != nil {
			return nil, fmt.Errorf("registering init metrics: %w", err)
		}
	}
	return a, nil
}

// admit reports whether source's secret may be compared now; if not, the
// reason and how long to wait.
func (a *secretAttempts) admit(source string) (reason string, wait time.Duration) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.sources[source]; ok && now.Before(s.next) {
		a.refused.WithLabelValues("source_backoff").Inc()
		return "source_backoff", s.next.Sub(now)
	}
	if !a.global.AllowN(now, 1) {
		a.refused.WithLabelValues("global_limit").Inc()
		return "global_limit", time.Duration(float64(time.Second) / a.limits.Global.Rate)
	}
	return "", 0
}

// wrong records a wrong secret from source.
func (a *secretAttempts) wrong(source string) {
	now := a.now()
	a.refused.WithLabelValues("wrong_secret").Inc()
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sources[source]
	if !ok {
		if len(a.sources) >= maxAttemptSources {
			a.evict(now)
		}
		s = &attemptState{}
		a.sources[source] = s
	}
	s.wrong++
	if k := s.wrong - a.limits.Free; k > 0 {
		backoff := a.limits.MaxBackoff
		if k < 32 {
			backoff = min(a.limits.Backoff<<(k-1), a.limits.MaxBackoff)
		}
		s.next = now.Add(backoff)
	}
}

// right clears source after a right secret.
func (a *secretAttempts) right(source string) {
	a.mu.Lock()
	delete(a.sources, source)
	a.mu.Unlock()
}

// evict drops sources whose backoff has passed; when none has, the oldest
// deadline goes, so memory stays bounded whatever the sources.
func (a *secretAttempts) evict(now time.Time) {
	var oldest string
	for src, s := range a.sources {
		if !now.Before(s.next) {
			delete(a.sources, src)
		} else if oldest == "" || s.next.Before(a.sources[oldest].next) {
			oldest = src
		}
	}
	if len(a.sources) >= maxAttemptSources {
		delete(a.sources, oldest)
	}
}
