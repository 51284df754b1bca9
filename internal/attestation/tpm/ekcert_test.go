package tpm_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// The testdata EK certificate was read from a TPM that swtpm.Manufacture
// provisioned with swtpm_localca as the manufacturer CA (TestManufacture
// makes such TPMs); the root and intermediate are that CA's.
func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func pool(t testing.TB, pemFiles ...string) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	for _, f := range pemFiles {
		if !p.AppendCertsFromPEM(readTestdata(t, f)) {
			t.Fatalf("%s holds no certificate", f)
		}
	}
	return p
}

func TestParseEKCertificate(t *testing.T) {
	ek, err := tpm.ParseEKCertificate(readTestdata(t, "swtpm-ek-rsa.der"))
	if err != nil {
		t.Fatal(err)
	}
	if ek.Manufacturer != "id:00001014" || ek.Model != "swtpm" || ek.Version != "id:20191023" {
		t.Fatalf("TPM %q %q %q, want swtpm's attributes", ek.Manufacturer, ek.Model, ek.Version)
	}
	roots, inter := pool(t, "swtpm-localca-root.pem"), pool(t, "swtpm-localca-intermediate.pem")
	if err := ek.Verify(roots, inter, time.Now()); err != nil {
		t.Fatalf("EK certificate of the configured manufacturer: %v", err)
	}

	otherRoot := selfSigned(t, nil)
	others := x509.NewCertPool()
	others.AddCert(otherRoot)
	tests := []struct {
		name string
		run  func() error
		want error
		says string
	}{
		{"another manufacturer", func() error { return ek.Verify(others, inter, time.Now()) }, attestation.ErrUntrustedKey, "unknown authority"},
		{"not yet valid", func() error { return ek.Verify(roots, inter, ek.Certificate.NotBefore.Add(-time.Hour)) }, attestation.ErrUntrustedKey, "expired or is not yet valid"},
		{"not an EK certificate", func() error {
			block, _ := pem.Decode(readTestdata(t, "swtpm-localca-intermediate.pem"))
			_, err := tpm.ParseEKCertificate(block.Bytes)
			return err
		}, attestation.ErrUntrustedKey, "not an EK certificate"},
		{"unknown critical extension", func() error {
			_, err := tpm.ParseEKCertificate(selfSigned(t, []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Critical: true, Value: []byte{5, 0}}}).Raw)
			return err
		}, attestation.ErrUntrustedKey, "unhandled critical extensions"},
		{"garbage", func() error { _, err := tpm.ParseEKCertificate([]byte("not a certificate")); return err }, attestation.ErrMalformed, "EK certificate"},
		{"oversized", func() error { _, err := tpm.ParseEKCertificate(make([]byte, tpm.MaxEKCertificateSize+1)); return err }, attestation.ErrMalformed, "exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.run()
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("got %v, want %v saying %q", err, tt.want, tt.says)
			}
		})
	}
}

// selfSigned makes a certificate with the EK extended key usage and extra
// extensions.
func selfSigned(t testing.TB, extra []pkix.Extension) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		UnknownExtKeyUsage: []asn1.ObjectIdentifier{{2, 23, 133, 8, 1}}, ExtraExtensions: extra,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// FuzzParseEKCertificate: an EK certificate comes from the network (a
// joining node); parsing never panics and a parsed one is complete.
func FuzzParseEKCertificate(f *testing.F) {
	f.Add(readTestdata(f, "swtpm-ek-rsa.der"))
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, der []byte) {
		ek, err := tpm.ParseEKCertificate(der)
		if err == nil && (ek == nil || ek.Certificate == nil) {
			t.Fatal("ParseEKCertificate returned neither an error nor a certificate")
		}
	})
}
