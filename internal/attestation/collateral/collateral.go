// Package collateral fetches attestation collateral (AMD KDS certificates
// and CRLs; Intel PCS TCB info, QE identity and CRLs with their issuer
// chain headers) through an on-disk cache, so a verifier works offline once
// what it needs was fetched, and never trusts a stale revocation list or
// TCB info. A Cache is a go-sev-guest trust.HTTPSGetter (and
// ContextHTTPSGetter); Cache.TDX is its go-tdx-guest form.
package collateral

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	tdxtrust "github.com/google/go-tdx-guest/verify/trust"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// maxSize bounds one collateral document in bytes; AMD's CRLs and
// certificate chains are a few kilobytes.
const maxSize = 1 << 20

// Fetcher gets a URL's headers and body; Cache.Upstream in production is
// HTTP. Only issuer chain headers are kept (see HTTP).
type Fetcher func(ctx context.Context, url string) (http.Header, []byte, error)

// Cache serves collateral from Dir, fetching through Upstream what is
// missing or stale. Freshness: a CRL until its NextUpdate; Intel's TCB
// info and QE identity (JSON) until their nextUpdate; a certificate or
// certificate bundle until the earliest NotAfter in it; anything else for
// MaxAge. A stale entry is fetched again; if that fails, a stale CRL or
// TCB info is an error (revocations or TCB levels may be out of date), a
// stale certificate is served (certificates do not change). Documents stay
// in memory once read, so verifications on the hot path do not read and
// parse Dir again. Safe for concurrent use; use it by pointer.
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

	mu  sync.Mutex
	mem map[string]entry // by URL: what was read from Dir or fetched
}

// HTTP returns a Fetcher using client (nil: a client with a 30 s timeout),
// refusing non-2xx answers and bodies over maxSize. Of the headers it keeps
// only the issuer chains Intel PCS sends its signing certificates in
// ("TCB-Info-Issuer-Chain", "SGX-Enclave-Identity-Issuer-Chain",
// "SGX-PCK-CRL-Issuer-Chain").
func HTTP(client *http.Client) Fetcher {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	return func(ctx context.Context, url string) (http.Header, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return nil, nil, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxSize+1))
		if err != nil {
			return nil, nil, err
		}
		if len(body) > maxSize {
			return nil, nil, fmt.Errorf("GET %s: body exceeds %d bytes", url, maxSize)
		}
		return issuerChains(resp.Header), body, nil
	}
}

// issuerChains returns the issuer chain headers of h, or nil.
func issuerChains(h http.Header) http.Header {
	var out http.Header
	for name, values := range h {
		if strings.HasSuffix(http.CanonicalHeaderKey(name), "-Issuer-Chain") {
			if out == nil {
				out = http.Header{}
			}
			out[http.CanonicalHeaderKey(name)] = values
		}
	}
	return out
}

// Get returns url's collateral (go-sev-guest trust.HTTPSGetter).
func (c *Cache) Get(url string) ([]byte, error) { return c.GetContext(context.Background(), url) }

// GetContext returns url's collateral: the cached copy while fresh, else
// fetched (and cached) through Upstream. Errors name the URL and, offline,
// say that the cache lacks it.
func (c *Cache) GetContext(ctx context.Context, url string) ([]byte, error) {
	_, body, err := c.get(ctx, url)
	return body, err
}

// TDX returns c as a go-tdx-guest trust.HTTPSGetter, which also needs
// the issuer chain headers.
func (c *Cache) TDX() tdxtrust.HTTPSGetter { return tdxGetter{c} }

type tdxGetter struct{ c *Cache }

func (g tdxGetter) Get(url string) (map[string][]string, []byte, error) {
	return g.GetContext(context.Background(), url)
}

func (g tdxGetter) GetContext(ctx context.Context, url string) (map[string][]string, []byte, error) {
	return g.c.get(ctx, url)
}

// entry is a collateral document in memory with its freshness.
type entry struct {
	header http.Header
	body   []byte
	// until is when it stops being fresh; expires says it must not be
	// served past that (a CRL, TCB info, QE identity).
	until   time.Time
	expires bool
}

// newEntry computes the freshness of a document fetched at fetched.
func (c *Cache) newEntry(header http.Header, body []byte, fetched time.Time) entry {
	e := entry{header: header, body: body}
	if crl, err := x509.ParseRevocationList(body); err == nil {
		e.until, e.expires = crl.NextUpdate, true
	} else if next, ok := pcsNextUpdate(body); ok {
		e.until, e.expires = next, true
	} else if notAfter, ok := earliestNotAfter(body); ok {
		e.until = notAfter
	} else {
		maxAge := c.MaxAge
		if maxAge == 0 {
			maxAge = time.Hour
		}
		e.until = fetched.Add(maxAge)
	}
	return e
}

// cached returns url's entry from memory, or from Dir (remembered, so a
// verification on the hot path reads and parses each document once).
func (c *Cache) cached(url, path string) (entry, bool, error) {
	c.mu.Lock()
	e, ok := c.mem[url]
	c.mu.Unlock()
	if ok {
		return e, true, nil
	}
	body, header, err := readEntry(path)
	if err != nil || body == nil {
		return entry{}, false, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return entry{}, false, err
	}
	e = c.newEntry(header, body, fi.ModTime())
	c.remember(url, e)
	return e, true, nil
}

func (c *Cache) remember(url string, e entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mem == nil {
		c.mem = map[string]entry{}
	}
	c.mem[url] = e
}

// get returns url's headers and body; see GetContext.
func (c *Cache) get(ctx context.Context, url string) (http.Header, []byte, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	path := filepath.Join(c.Dir, cacheName(url))
	e, ok, err := c.cached(url, path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading cached collateral for %s: %w", url, err)
	}
	if ok && now().Before(e.until) {
		return e.header, e.body, nil
	}
	var staleErr error
	if ok && e.expires {
		staleErr = fmt.Errorf("the cached revocation list or TCB information from %s is past its next update", url)
	}
	if c.Upstream == nil {
		switch {
		case staleErr != nil:
			return nil, nil, fmt.Errorf("%w, and the verifier is offline: fetch it again online", staleErr)
		case ok:
			return e.header, e.body, nil // a certificate: still the same certificate
		default:
			return nil, nil, fmt.Errorf("collateral %s is not cached, and the verifier is offline: run it online once to fill %s", url, c.Dir)
		}
	}
	header, body, err := c.Upstream(ctx, url)
	if err != nil {
		if ok && staleErr == nil {
			return e.header, e.body, nil
		}
		return nil, nil, fmt.Errorf("fetching collateral %s: %w", url, err)
	}
	if err := writeEntry(c.Dir, path, header, body); err != nil {
		return nil, nil, fmt.Errorf("caching collateral %s: %w", url, err)
	}
	c.remember(url, c.newEntry(header, body, now()))
	return header, body, nil
}

// readEntry reads a cached body and its headers; a missing entry is nil
// and no error.
func readEntry(path string) ([]byte, http.Header, error) {
	body, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	raw, err := os.ReadFile(path + ".header")
	if errors.Is(err, os.ErrNotExist) {
		return body, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var header http.Header
	if err := json.Unmarshal(raw, &header); err != nil {
		return nil, nil, fmt.Errorf("%s.header: %w", path, err)
	}
	return body, header, nil
}

// writeEntry caches body and header, the header first: a body is never
// served without the headers fetched with it.
func writeEntry(dir, path string, header http.Header, body []byte) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if len(header) > 0 {
		raw, err := json.Marshal(header)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(path+".header", raw, 0o644); err != nil {
			return err
		}
	} else if err := os.Remove(path + ".header"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return atomicfile.Write(path, body, 0o644)
}

// pcsNextUpdate returns the nextUpdate of an Intel PCS TCB info or QE
// identity document ({"tcbInfo": {..., "nextUpdate": ...}, "signature": ...}).
func pcsNextUpdate(body []byte) (time.Time, bool) {
	var doc map[string]json.RawMessage
	if json.Unmarshal(body, &doc) != nil {
		return time.Time{}, false
	}
	for _, name := range []string{"tcbInfo", "enclaveIdentity"} {
		var inner struct {
			NextUpdate time.Time `json:"nextUpdate"`
		}
		if raw, ok := doc[name]; ok && json.Unmarshal(raw, &inner) == nil && !inner.NextUpdate.IsZero() {
			return inner.NextUpdate, true
		}
	}
	return time.Time{}, false
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
