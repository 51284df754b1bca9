package joinservice

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// heldRoundTripper answers each request once its test releases it, and
// counts the requests it holds.
type heldRoundTripper struct {
	held    atomic.Int32
	release chan struct{}
	err     error
}

func (h *heldRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if h.err != nil {
		return nil, h.err
	}
	h.held.Add(1)
	defer h.held.Add(-1)
	<-h.release
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

func request(ctx context.Context, t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// roundTrip runs one request through rt and closes the response body at
// once.
func roundTrip(rt http.RoundTripper, req *http.Request) error {
	resp, err := rt.RoundTrip(req)
	if err == nil {
		err = resp.Body.Close()
	}
	return err
}

// TestLimitAPIRequests: at most n requests are in flight until their
// bodies are closed; watches pass; a waiting request gives up with its
// context; a failed request gives its slot back.
func TestLimitAPIRequests(t *testing.T) {
	const n = 3
	inner := &heldRoundTripper{release: make(chan struct{})}
	rt := LimitAPIRequests(n)(inner)
	responses := make(chan *http.Response, n+2)
	for range n + 2 {
		go func() {
			resp, err := rt.RoundTrip(request(t.Context(), t, "https://api/api/v1/namespaces/kube-system/secrets")) //nolint:bodyclose // closed below, to free the slots in turn
			if err != nil {
				t.Error(err)
			}
			responses <- resp
		}()
	}
	waitHeld := func(want int32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for inner.held.Load() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d requests in flight, want %d", inner.held.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitHeld(n)
	time.Sleep(20 * time.Millisecond)
	if got := inner.held.Load(); got != n {
		t.Fatalf("%d requests in flight, want at most %d", got, n)
	}

	// A watch is not held back by the full slots.
	watched := make(chan error, 1)
	go func() {
		watched <- roundTrip(rt, request(t.Context(), t, "https://api/api/v1/namespaces/x/configmaps?watch=true"))
	}()
	waitHeld(n + 1)

	// A request waiting for a slot gives up when its context ends.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := roundTrip(rt, request(ctx, t, "https://api/api/v1/namespaces/x/configmaps")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting request: %v, want context.DeadlineExceeded", err)
	}

	// Responses come back; only closing their bodies frees the slots for
	// the two waiting requests.
	close(inner.release)
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	for range n {
		_ = (<-responses).Body.Close()
	}
	for range 2 {
		_ = (<-responses).Body.Close()
	}

	// A failed request gives its slot back.
	failing := LimitAPIRequests(1)(&heldRoundTripper{err: errors.New("refused")})
	for range 2 {
		if err := roundTrip(failing, request(t.Context(), t, "https://api/api/v1/secrets")); err == nil {
			t.Fatal("want the inner error")
		}
	}
}
