// Package collateral fetches attestation collateral (AMD KDS certificates
// and CRLs; later Intel PCS TCB info and QE identity) through an on-disk
// cache, so a verifier works offline once what it needs was fetched, and
// never trusts a stale revocation list. It is a go-sev-guest
// trust.HTTPSGetter (and ContextHTTPSGetter).
package collateral

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// MaxSize bounds one collateral document in bytes; AMD's CRLs and
// certificate chains are a few kilobytes.
const MaxSize = 1 << 20

// Fetcher gets a URL's body; Cache.Upstream in production is HTTP.
type Fetcher func(ctx context.Context, url string) ([]byte, error)

// Cache serves collateral from Dir, fetching through Upstream what is
// missing or stale. Freshness: a CRL until its NextUpdate; a certificate
// or certificate bundle until the earliest NotAfter in it; anything else
// for MaxAge. A stale entry is fetched again; if that fails, a stale CRL is
// an error (its revocations may be out of date), a stale certificate is
// served (certificates do not change). Safe for concurrent use.
type Cache struct {
	// Dir holds one file per URL (named by the URL's SHA-256).
	Dir string
	// Upstream fetches a URL; nil means offline: only cached entries serve.
	Upstream Fetcher
	// MaxAge is how long an entry that is neither a CRL nor a certificate
	// stays fresh; zero means an hour.
	MaxAge time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// HTTP returns a Fetcher using client (nil: a client with a 30 s timeout),
// refusing non-2xx answers and bodies over MaxSize.
func HTTP(client *http.Client) Fetcher {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	return func(ctx context.Context, url string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, MaxSize+1))
		if err != nil {
			return nil, err
		}
		if len(body) > MaxSize {
			return nil, fmt.Errorf("GET %s: body exceeds %d bytes", url, MaxSize)
		}
		return body, nil
	}
}

// Get returns url's collateral (go-sev-guest trust.HTTPSGetter).
func (c *Cache) Get(url string) ([]byte, error) { return c.GetContext(context.Background(), url) }

// GetContext returns url's collateral: the cached copy while fresh, else
// fetched (and cached) through Upstream. Errors name the URL and, offline,
// say that the cache lacks it.
func (c *Cache) GetContext(ctx context.Context, url string) ([]byte, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	path := filepath.Join(c.Dir, cacheName(url))
	cached, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading cached collateral for %s: %w", url, err)
	}
	var staleErr error
	if cached != nil {
		fresh, isCRL := c.fresh(cached, path, now())
		if fresh {
			return cached, nil
		}
		if isCRL {
			staleErr = fmt.Errorf("the cached revocation list from %s is past its next update", url)
		}
	}
	if c.Upstream == nil {
		switch {
		case staleErr != nil:
			return nil, fmt.Errorf("%w, and the verifier is offline: fetch it again online", staleErr)
		case cached != nil:
			return cached, nil // a certificate: still the same certificate
		default:
			return nil, fmt.Errorf("collateral %s is not cached, and the verifier is offline: run it online once to fill %s", url, c.Dir)
		}
	}
	body, err := c.Upstream(ctx, url)
	if err != nil {
		if cached != nil && staleErr == nil {
			return cached, nil
		}
		return nil, fmt.Errorf("fetching collateral %s: %w", url, err)
	}
	if err := os.MkdirAll(c.Dir, 0o750); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(path, body, 0o644); err != nil {
		return nil, fmt.Errorf("caching collateral %s: %w", url, err)
	}
	return body, nil
}

// fresh reports whether a cached body is still fresh at now, and whether
// it is a CRL.
func (c *Cache) fresh(body []byte, path string, now time.Time) (fresh, isCRL bool) {
	if crl, err := x509.ParseRevocationList(body); err == nil {
		return now.Before(crl.NextUpdate), true
	}
	if notAfter, ok := earliestNotAfter(body); ok {
		return now.Before(notAfter), false
	}
	fi, err := os.Stat(path)
	if err != nil {
		return false, false
	}
	maxAge := c.MaxAge
	if maxAge == 0 {
		maxAge = time.Hour
	}
	return now.Sub(fi.ModTime()) < maxAge, false
}

// earliestNotAfter returns the earliest NotAfter of the certificates in
// body (one DER certificate, or a PEM bundle).
func earliestNotAfter(body []byte) (time.Time, bool) {
	if cert, err := x509.ParseCertificate(body); err == nil {
		return cert.NotAfter, true
	}
	var earliest time.Time
	for rest := body; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return time.Time{}, false
		}
		if earliest.IsZero() || cert.NotAfter.Before(earliest) {
			earliest = cert.NotAfter
		}
	}
	return earliest, !earliest.IsZero()
}

func cacheName(url string) string {
	sum := sha256.Sum256([]byte(url))
	return hex.EncodeToString(sum[:])
}
