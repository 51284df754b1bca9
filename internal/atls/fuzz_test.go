package atls

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// FuzzVerifyPeer feeds certificate bytes, as a peer would send them, to the
// certificate and extension parsing: it must never panic, and nothing but a
// certificate for this handshake's nonce may verify.
func FuzzVerifyPeer(f *testing.F) {
	pair := newTPMPair(f)
	nonce := make([]byte, attestation.NonceSize)
	c := &Config{Attester: pair.attester}
	cert, err := c.attestedCertificate(context.Background(), nonce)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(cert.Certificate[0])
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x01})
	verifierSide := &Config{Verifiers: []attestation.Verifier{pair.verifier}, Now: time.Now}
	f.Fuzz(func(t *testing.T, der []byte) {
		// As crypto/tls does before VerifyConnection: parse, then verify.
		parsed, err := x509.ParseCertificate(der)
		if err != nil {
			return
		}
		result, _, err := verifierSide.verifyPeer(context.Background(), parsed, nonce)
		if err != nil {
			return
		}
		if h := sha256.Sum256(parsed.RawSubjectPublicKeyInfo); string(result.UserData) != string(h[:]) {
			t.Fatal("verified evidence is not bound to the certificate's key")
		}
	})
}
