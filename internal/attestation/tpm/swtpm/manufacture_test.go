package swtpm

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/google/go-tpm-tools/client"
)

func parsePEM(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("no PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestManufacture: a manufactured TPM holds an RSA EK whose certificate, in
// the TCG's NV index, certifies that very key and chains to the local CA's
// root through its intermediate; a TPM of another CA does not.
func TestManufacture(t *testing.T) {
	dir := t.TempDir()
	ca := LocalCA{Dir: filepath.Join(dir, "ca")}
	other := LocalCA{Dir: filepath.Join(dir, "other-ca")}
	if err := Manufacture(t.Context(), filepath.Join(dir, "tpm"), ca); err != nil {
		t.Fatal(err)
	}
	if err := other.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	sw, err := Start(t.Context(), filepath.Join(dir, "tpm"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	rw, err := sw.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	ek, err := client.EndorsementKeyRSA(rw)
	if err != nil {
		t.Fatal(err)
	}
	defer ek.Close()
	cert := ek.Cert()
	if cert == nil {
		t.Fatal("the TPM holds no EK certificate")
	}
	if !reflect.DeepEqual(cert.PublicKey, ek.PublicKey()) {
		t.Fatal("the EK certificate certifies another key than the TPM's EK")
	}
	// An EK certificate names the TPM's manufacturer, model and version in
	// a critical subjectAltName holding only a directoryName (TCG EK
	// Credential Profile 2.0, §3.2.9), which crypto/x509 leaves unhandled.
	san := asn1.ObjectIdentifier{2, 5, 29, 17}
	if len(cert.UnhandledCriticalExtensions) != 1 || !cert.UnhandledCriticalExtensions[0].Equal(san) {
		t.Fatalf("unhandled critical extensions %v, want only the TPM's subjectAltName", cert.UnhandledCriticalExtensions)
	}
	cert.UnhandledCriticalExtensions = nil
	for _, tt := range []struct {
		name   string
		ca     LocalCA
		chains bool
	}{{"the manufacturer's CA", ca, true}, {"another CA", other, false}} {
		root, intermediate, err := tt.ca.Roots()
		if err != nil {
			t.Fatal(err)
		}
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(parsePEM(t, root))
		inter.AddCert(parsePEM(t, intermediate))
		_, err = cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if (err == nil) != tt.chains {
			t.Errorf("EK certificate against %s: %v, want chains %v", tt.name, err, tt.chains)
		}
	}
}
