package keyservice

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

type metrics struct {
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	latency  prometheus.Histogram
	// handshakes counts TLS handshakes by result and refusal reason.
	handshakes *prometheus.CounterVec
	reg        prometheus.Registerer
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatehouse_keyservice_requests_total",
			Help: "GetDataKey requests by gRPC status code.",
		}, []string{"code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatehouse_keyservice_errors_total",
			Help: "GetDataKey requests that failed, by gRPC status code.",
		}, []string{"code"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gatehouse_keyservice_request_duration_seconds",
			Help:    "GetDataKey latency in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 4, 10),
		}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatehouse_keyservice_handshakes_total",
			Help: "Mutual TLS handshakes by result (allowed, refused) and reason.",
		}, []string{"result", "reason"}),
		reg: reg,
	}
	for _, c := range []prometheus.Collector{m.requests, m.errors, m.latency, m.handshakes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(code codes.Code, d time.Duration) {
	m.requests.WithLabelValues(code.String()).Inc()
	if code != codes.OK {
		m.errors.WithLabelValues(code.String()).Inc()
	}
	m.latency.Observe(d.Seconds())
}
