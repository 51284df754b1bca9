// Package swtpmtest gives tests manufactured software TPMs: swtpm TPMs
// whose EK certificates a local CA issued (swtpm.Manufacture), with
// attesters sending those certificates, and the attackers' attesters that
// key activation must refuse.
package swtpmtest

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/asn1"
	"math/big"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// CA returns an initialised local CA in a temporary directory.
func CA(t testing.TB) swtpm.LocalCA {
	t.Helper()
	ca := swtpm.LocalCA{Dir: filepath.Join(t.TempDir(), "ca")}
	if err := ca.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	return ca
}

// Pools returns ca's root and intermediate as certificate pools, as a
// verifier configures them.
func Pools(t testing.TB, ca swtpm.LocalCA) (roots, intermediates *x509.CertPool) {
	t.Helper()
	root, inter, err := ca.Roots()
	if err != nil {
		t.Fatal(err)
	}
	roots, intermediates = x509.NewCertPool(), x509.NewCertPool()
	if !roots.AppendCertsFromPEM(root) || !intermediates.AppendCertsFromPEM(inter) {
		t.Fatal("the local CA's certificates do not parse")
	}
	return roots, intermediates
}

// Manufactured is a running manufactured TPM.
type Manufactured struct {
	TPM *swtpm.TPM
	// Attester sends the EK certificate (Options.EKCertificate).
	Attester *tpmattester.QuoteAttester
}

// Manufacture makes and starts a TPM whose EK certificate ca issued, first
// running prepare (when set) on it, e.g. to measure a boot, and returns it
// with an attester quoting pcrs. Everything stops when the test ends.
func Manufacture(t testing.TB, ca swtpm.LocalCA, pcrs []int, prepare func(*swtpm.TPM) error) *Manufactured {
	t.Helper()
	dir := t.TempDir()
	if err := swtpm.Manufacture(t.Context(), dir, ca); err != nil {
		t.Fatal(err)
	}
	sw, err := swtpm.Start(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	if prepare != nil {
		if err := prepare(sw); err != nil {
			t.Fatal(err)
		}
	}
	rw, err := sw.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: pcrs, EKCertificate: tpmattester.EKCertificateRequired})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return &Manufactured{TPM: sw, Attester: a}
}

// SwappedEK is an attacker's attester: its evidence, from its own TPM,
// carries another TPM's EK certificate, so its AK is not resident with
// that EK and it cannot answer the activation challenge.
type SwappedEK struct {
	*tpmattester.QuoteAttester
	// EKCertificate is the other TPM's EK certificate, DER.
	EKCertificate []byte
}

// Attest returns the attester's evidence with the EK certificate swapped.
func (s SwappedEK) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	ev, err := s.QuoteAttester.Attest(ctx, userData, nonce)
	if err != nil {
		return nil, err
	}
	var m attestationv1.TPMEvidence
	if err := proto.Unmarshal(ev, &m); err != nil {
		return nil, err
	}
	m.EndorsementKeyCertificate = s.EKCertificate
	return proto.Marshal(&m)
}

// Replaying is an attacker's attester that answers its first activation
// challenge with its TPM and every later one with that first answer, as a
// replayed recording would.
type Replaying struct {
	*tpmattester.QuoteAttester
	mu     sync.Mutex
	answer []byte
}

// Activate answers the first challenge truly and replays that answer.
func (r *Replaying) Activate(ctx context.Context, challenge []byte) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answer == nil {
		answer, err := r.QuoteAttester.Activate(ctx, challenge)
		if err != nil {
			return nil, err
		}
		r.answer = answer
	}
	return r.answer, nil
}

// ReissueEK issues, from ca, a new certificate for the EK that ekCert
// (DER) certifies, keeping its TPM subjectAltName, valid in [notBefore,
// notAfter], with the EK extended key usage or without it: an expired or
// non-EK certificate for a genuine EK, from a CA a test may trust.
func ReissueEK(t testing.TB, ekCert []byte, ca *testkit.CA, notBefore, notAfter time.Time, ekUsage bool) []byte {
	t.Helper()
	cert, err := x509.ParseCertificate(ekCert)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageKeyEncipherment}
	if ekUsage {
		tmpl.UnknownExtKeyUsage = []asn1.ObjectIdentifier{{2, 23, 133, 8, 1}}
	}
	for _, ext := range cert.Extensions {
		if ext.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}) {
			tmpl.ExtraExtensions = append(tmpl.ExtraExtensions, ext)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, cert.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
