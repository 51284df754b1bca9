package collateral_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/collateral"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// TestCache: a certificate is cached until it expires and served when the
// upstream fails; other documents for MaxAge; offline, only cached ones
// serve; the HTTP fetcher refuses errors and oversized bodies.
func TestCache(t *testing.T) {
	cert := testkit.NewCA(t, "kds").Cert.Raw // valid for an hour
	calls := 0
	var fail bool
	upstream := func(_ context.Context, url string) ([]byte, error) {
		calls++
		if fail {
			return nil, errors.New("KDS unreachable")
		}
		if url == "https://kds/cert" {
			return cert, nil
		}
		return []byte("tcb info"), nil
	}
	now := time.Now()
	clock := func() time.Time { return now }
	c := &collateral.Cache{Dir: t.TempDir(), Upstream: upstream, MaxAge: time.Minute, Now: clock}
	for i := 0; i < 2; i++ {
		if got, err := c.Get("https://kds/cert"); err != nil || string(got) != string(cert) {
			t.Fatalf("get %d: %v", i, err)
		}
	}
	if calls != 1 {
		t.Fatalf("upstream called %d times for a fresh certificate, want 1", calls)
	}
	now = now.Add(2 * time.Hour) // the certificate expired: fetched again, served stale when that fails
	fail = true
	if got, err := c.Get("https://kds/cert"); err != nil || string(got) != string(cert) || calls != 2 {
		t.Fatalf("expired certificate, upstream down: %v after %d calls", err, calls)
	}
	fail = false
	if _, err := c.Get("https://kds/tcb"); err != nil {
		t.Fatal(err)
	}
	offline := &collateral.Cache{Dir: c.Dir, MaxAge: time.Minute, Now: clock}
	if got, err := offline.Get("https://kds/tcb"); err != nil || string(got) != "tcb info" {
		t.Fatalf("offline, cached: %q, %v", got, err)
	}
	if _, err := offline.Get("https://kds/other"); err == nil || !strings.Contains(err.Error(), "not cached") {
		t.Fatalf("offline, not cached: %v", err)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = w.Write(make([]byte, collateral.MaxSize+1))
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	fetch := collateral.HTTP(srv.Client())
	if _, err := fetch(t.Context(), srv.URL+"/missing"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: %v", err)
	}
	if _, err := fetch(t.Context(), srv.URL+"/big"); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("oversized body: %v", err)
	}
}

// FuzzCache: whatever the KDS answers, the cache stores and serves it
// without panicking, and serves exactly what was fetched.
func FuzzCache(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{0x30, 0x82, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, body []byte) {
		c := &collateral.Cache{Dir: t.TempDir(), Upstream: func(context.Context, string) ([]byte, error) { return body, nil }}
		for i := 0; i < 2; i++ {
			got, err := c.Get("https://kds/doc")
			if err != nil || string(got) != string(body) {
				t.Fatalf("get %d: %v", i, err)
			}
		}
	})
}
