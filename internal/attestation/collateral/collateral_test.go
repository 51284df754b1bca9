package collateral_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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
	upstream := func(_ context.Context, url string) (http.Header, []byte, error) {
		calls++
		if fail {
			return nil, nil, errors.New("KDS unreachable")
		}
		if url == "https://kds/cert" {
			return nil, cert, nil
		}
		return nil, []byte("tcb info"), nil
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
		if r.URL.Path == "/tcb" {
			w.Header().Set("TCB-Info-Issuer-Chain", "chain")
			w.Header().Set("Set-Cookie", "not collateral")
			_, _ = w.Write([]byte("{}"))
			return
		}
		if r.URL.Path == "/big" {
			_, _ = w.Write(make([]byte, collateral.MaxSize+1))
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	fetch := collateral.HTTP(srv.Client())
	if _, _, err := fetch(t.Context(), srv.URL+"/missing"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: %v", err)
	}
	if header, _, err := fetch(t.Context(), srv.URL+"/tcb"); err != nil || len(header) != 1 || header.Get("Tcb-Info-Issuer-Chain") != "chain" {
		t.Fatalf("headers kept: %v, %v; want only the issuer chain", header, err)
	}
	if _, _, err := fetch(t.Context(), srv.URL+"/big"); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("oversized body: %v", err)
	}
}

// TestTDXCollateral: Intel's TCB info is served with its issuer chain
// header, offline too, until its nextUpdate; then offline it is refused.
func TestTDXCollateral(t *testing.T) {
	next := time.Now().Add(time.Hour)
	tcbInfo := []byte(`{"tcbInfo":{"id":"TDX","nextUpdate":"` + next.UTC().Format(time.RFC3339) + `"},"signature":"00"}`)
	header := http.Header{"Tcb-Info-Issuer-Chain": {"pem chain"}}
	dir := t.TempDir()
	online := &collateral.Cache{Dir: dir, Upstream: func(context.Context, string) (http.Header, []byte, error) { return header, tcbInfo, nil }}
	if h, body, err := online.TDX().Get("https://pcs/tcb"); err != nil || string(body) != string(tcbInfo) || h["Tcb-Info-Issuer-Chain"][0] != "pem chain" {
		t.Fatalf("online: %v %q %v", h, body, err)
	}
	// Held in memory: the same cache serves it without reading Dir again.
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	moved := t.TempDir()
	for _, f := range files {
		if err := os.Rename(f, filepath.Join(moved, filepath.Base(f))); err != nil {
			t.Fatal(err)
		}
	}
	online.Upstream = nil
	if _, body, err := online.TDX().Get("https://pcs/tcb"); err != nil || string(body) != string(tcbInfo) {
		t.Fatalf("from memory: %q %v", body, err)
	}
	for _, f := range files {
		if err := os.Rename(filepath.Join(moved, filepath.Base(f)), f); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	offline := &collateral.Cache{Dir: dir, Now: func() time.Time { return now }}
	if h, _, err := offline.TDX().Get("https://pcs/tcb"); err != nil || h["Tcb-Info-Issuer-Chain"][0] != "pem chain" {
		t.Fatalf("offline before nextUpdate: %v %v", h, err)
	}
	now = next.Add(time.Minute)
	if _, _, err := offline.TDX().Get("https://pcs/tcb"); err == nil || !strings.Contains(err.Error(), "past its next update") {
		t.Fatalf("offline after nextUpdate: %v, want refused", err)
	}
}

// FuzzCache: whatever the KDS answers, the cache stores and serves it
// without panicking, and serves exactly what was fetched.
func FuzzCache(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{0x30, 0x82, 0x01, 0x00})
	f.Add([]byte(`{"tcbInfo":{"nextUpdate":"2099-01-01T00:00:00Z"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		c := &collateral.Cache{Dir: t.TempDir(), Upstream: func(context.Context, string) (http.Header, []byte, error) { return nil, body, nil }}
		for i := 0; i < 2; i++ {
			got, err := c.Get("https://kds/doc")
			if err != nil || string(got) != string(body) {
				t.Fatalf("get %d: %v", i, err)
			}
		}
	})
}
