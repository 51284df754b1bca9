package joinservice

import (
	"io"
	"net/http"
	"sync"

	"k8s.io/client-go/transport"
)

// MaxAPIRequestsInFlight bounds the join service's Kubernetes API requests
// in flight, watches aside. The API server takes 100 streams per HTTP/2
// connection (kube-apiserver's default --http2-max-streams-per-connection);
// beyond that client-go's HTTP/2 transport opens another connection, a TLS
// handshake on both sides, per waiting request. Without a bound, a storm
// of joins after a quiet spell (client-go closes connections idle for 90 s)
// opened dozens of connections at once: 83 for 200 concurrent joins in
// BenchmarkJoinStorm (docs/benchmarks.md, "Join service"). 64 requests in
// flight keep the service on one connection, with room for its watches.
const MaxAPIRequestsInFlight = 64

// LimitAPIRequests returns a rest.Config transport wrapper (Config.Wrap)
// that lets at most n requests be in flight, from sending the request until
// its response body is closed; watches do not count and are not held back.
// A request waiting for its turn gives up when its context ends.
func LimitAPIRequests(n int) transport.WrapperFunc {
	slots := make(chan struct{}, n)
	return func(rt http.RoundTripper) http.RoundTripper {
		return &inFlightLimit{rt: rt, slots: slots}
	}
}

type inFlightLimit struct {
	rt    http.RoundTripper
	slots chan struct{}
}

func (l *inFlightLimit) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Query().Get("watch") == "true" {
		return l.rt.RoundTrip(req)
	}
	select {
	case l.slots <- struct{}{}:
	case <-req.Context().Done():
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper closes the request body, even on errors
		}
		return nil, req.Context().Err()
	}
	resp, err := l.rt.RoundTrip(req)
	if err != nil {
		<-l.slots
		return nil, err
	}
	resp.Body = &releasingBody{ReadCloser: resp.Body, release: func() { <-l.slots }}
	return resp, nil
}

// releasingBody gives the request's slot back when it is closed, once.
type releasingBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (b *releasingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.release)
	return err
}
