// Package swtpmtest gives tests manufactured software TPMs: swtpm TPMs
// whose EK certificates a local CA issued (swtpm.Manufacture), with
// attesters sending those certificates.
package swtpmtest

import (
	"crypto/x509"
	"path/filepath"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
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
	Attester *tpmattester.Attester
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
