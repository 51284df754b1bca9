package snp

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"math/big"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/collateral"
)

// fakeKDS serves CRLs signed by the fake ARK, counting requests.
type fakeKDS struct {
	mu    sync.Mutex
	docs  map[string][]byte
	calls int
}

func (k *fakeKDS) fetch(_ context.Context, url string) (http.Header, []byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	if d, ok := k.docs[url]; ok {
		return nil, d, nil
	}
	return nil, nil, errors.New("404 " + url)
}

// crl returns a CRL of the fake ARK, valid for an hour, revoking serials.
func (f *fakeAMD) crl(t *testing.T, revoked ...*big.Int) []byte {
	t.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(time.Hour)}
	for _, serial := range revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: serial, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, f.Signer.Ark, f.Signer.Keys.Ark)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestRevocationsThroughCollateral: with revocation checks, the product's
// CRL comes from AMD's KDS through the on-disk collateral cache; once
// cached, verification works offline; a revoked ASK is refused; offline
// without a cached CRL, or with one past its next update, verification
// fails and says why.
func TestRevocationsThroughCollateral(t *testing.T) {
	f := newFakeAMD(t)
	crlURL := f.Signer.Ask.CRLDistributionPoints[0]
	good := &fakeKDS{docs: map[string][]byte{crlURL: f.crl(t)}}
	nonce := make([]byte, attestation.NonceSize)
	evidence := f.evidence(t, reportSpec{reportData: attestation.Binding512(nonce, []byte("ud")), tcb: testTCB, measurement: testMeasurement}, []byte("ud"), nil)
	verify := func(t *testing.T, cache *collateral.Cache) error {
		t.Helper()
		v := f.verifier(t, func(p *ReportPolicy) {
			p.TrustedRoots, p.Collateral, p.CheckRevocations = f.Roots() /* anew: go-sev-guest memoises a fetched CRL in them, and each case must fetch its own */, cache, true
		})
		_, err := v.Verify(t.Context(), evidence, nonce)
		return err
	}
	dir := t.TempDir()
	if err := verify(t, &collateral.Cache{Dir: dir, Upstream: good.fetch}); err != nil {
		t.Fatalf("online, CRL revoking nothing: %v", err)
	}
	if good.calls != 1 {
		t.Fatalf("the KDS was asked %d times, want once", good.calls)
	}
	if err := verify(t, &collateral.Cache{Dir: dir}); err != nil {
		t.Fatalf("offline with the CRL cached: %v", err)
	}

	revoked := &fakeKDS{docs: map[string][]byte{crlURL: f.crl(t, f.Signer.Ask.SerialNumber)}}
	if err := verify(t, &collateral.Cache{Dir: t.TempDir(), Upstream: revoked.fetch}); !errors.Is(err, attestation.ErrSignature) || !strings.Contains(err.Error(), "ASK was revoked") {
		t.Fatalf("revoked ASK: %v, want refused", err)
	}
	empty := t.TempDir()
	if err := verify(t, &collateral.Cache{Dir: empty}); err == nil || !strings.Contains(err.Error(), "not cached, and the verifier is offline") {
		t.Fatalf("offline without a cached CRL: %v", err)
	}
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	if err := verify(t, &collateral.Cache{Dir: dir, Now: later}); err == nil || !strings.Contains(err.Error(), "past its next update") {
		t.Fatalf("offline with a stale CRL: %v", err)
	}
	if _, err := NewReportVerifier(ReportPolicy{LaunchMeasurements: [][]byte{testMeasurement}, CheckRevocations: true}, time.Now); err == nil {
		t.Fatal("revocation checks without a collateral source were accepted")
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Fatal("an offline cache wrote files")
	}
}
