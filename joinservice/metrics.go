package joinservice

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's Prometheus metrics (docs/joinservice.md).
type metrics struct {
	attempts *prometheus.CounterVec
	verdicts *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	tokens   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "joinservice", Name: "attempts_total",
			Help: "Join service requests and attested TLS handshakes, by method (\"handshake\" for handshakes).",
		}, []string{"method"}),
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "joinservice", Name: "verdicts_total",
			Help: "Decisions by method, verdict (allowed, refused) and reason.",
		}, []string{"method", "verdict", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "gatehouse", Subsystem: "joinservice", Name: "request_duration_seconds",
			Help:    "Time to decide a request, after the attested TLS handshake, by method.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1 ms .. 8 s
		}, []string{"method"}),
		tokens: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "joinservice", Name: "tokens_issued_total",
			Help: "Bootstrap tokens handed out in join tickets (new, renewed or reused for a retried request).",
		}),
	}
	for _, c := range []prometheus.Collector{m.attempts, m.verdicts, m.latency, m.tokens} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}
