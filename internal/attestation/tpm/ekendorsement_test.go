package tpm_test

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// manufactured is a TPM made by swtpm_setup --create-ek-cert with a local
// CA as its manufacturer, and its attester sending the EK certificate.
type manufactured struct {
	attester *tpmattester.QuoteAttester
	ekCert   *x509.Certificate
}

func manufacture(t *testing.T, ca swtpm.LocalCA) *manufactured {
	t.Helper()
	m := swtpmtest.Manufacture(t, ca, testPCRs, nil)
	if !m.Attester.RequestsActivation() {
		t.Fatal("an attester sending its EK certificate does not request activation")
	}
	cert, err := x509.ParseCertificate(m.Attester.EKCertificate())
	if err != nil {
		t.Fatal(err)
	}
	return &manufactured{attester: m.Attester, ekCert: cert}
}

// TestEKEndorsement: with EK roots, a TPM's AK is trusted without any
// registration when its evidence carries an EK certificate from a
// configured manufacturer, and only once the TPM answered the activation
// challenge; every other EK certificate is refused with its reason.
func TestEKEndorsement(t *testing.T) {
	ca, other := swtpmtest.CA(t), swtpmtest.CA(t)
	node, stranger, foreign := manufacture(t, ca), manufacture(t, ca), manufacture(t, other)
	roots, inter := swtpmtest.Pools(t, ca)
	verifier := func(t *testing.T, roots, inter *x509.CertPool) *tpm.QuoteVerifier {
		t.Helper()
		v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: testPCRs, Endorsement: tpm.Endorsement{EKRoots: roots, EKIntermediates: inter}}, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	attest := func(t *testing.T, a *tpmattester.QuoteAttester, nonce []byte, change func(*attestationv1.TPMEvidence)) []byte {
		t.Helper()
		ev, err := a.Attest(t.Context(), []byte("user data"), nonce)
		if err != nil {
			t.Fatal(err)
		}
		if change != nil {
			ev = mutate(t, ev, change)
		}
		return ev
	}

	t.Run("EK from the configured manufacturer", func(t *testing.T) {
		nonce := newNonce(t)
		result, err := verifier(t, roots, inter).Verify(t.Context(), attest(t, node.attester, nonce, nil), nonce)
		if err != nil {
			t.Fatal(err)
		}
		if result.Activation == nil {
			t.Fatal("the result asks for no activation: the AK would be trusted without proof it lives with the EK")
		}
		if !strings.HasPrefix(result.Endorsement, "ek-certificate manufacturer=id:00001014 model=swtpm") {
			t.Fatalf("endorsement %q, want the EK certificate's TPM", result.Endorsement)
		}
		want, err := node.attester.Identity()
		if err != nil || result.Identity != want {
			t.Fatalf("identity %q, want the AK's %q (%v)", result.Identity, want, err)
		}
		// The EK certificate is an identity of its own, named by issuer
		// and serial, for deny lists.
		issuer := sha256.Sum256(node.ekCert.RawIssuer)
		ekID := "tpm-ek:" + hex.EncodeToString(issuer[:]) + ":" + node.ekCert.SerialNumber.Text(16)
		if ek := result.EKCertificate; ek == nil || !bytes.Equal(ek.Issuer, node.ekCert.RawIssuer) || ek.Serial.Cmp(node.ekCert.SerialNumber) != 0 ||
			!slices.Equal(result.Identities(), []string{want, ekID}) {
			t.Fatalf("EK certificate %+v, identities %q; want the node's EK certificate and %q", ek, result.Identities(), ekID)
		}
		challenge, secret, err := result.Activation.Challenge()
		if err != nil {
			t.Fatal(err)
		}
		answer, err := node.attester.Activate(t.Context(), challenge)
		if err != nil || !bytes.Equal(answer, secret) {
			t.Fatalf("the node's TPM answered %x, %v; want the secret", answer, err)
		}
		// Each challenge has a fresh secret: an answer is good once.
		_, again, err := result.Activation.Challenge()
		if err != nil || bytes.Equal(again, secret) {
			t.Fatalf("a second challenge reuses the secret (%v)", err)
		}
	})

	t.Run("AK not resident with the EK", func(t *testing.T) {
		// The stranger's AK signs, but the evidence carries the node's EK
		// certificate: verification passes, activation cannot.
		nonce := newNonce(t)
		ev := attest(t, stranger.attester, nonce, func(e *attestationv1.TPMEvidence) { e.EndorsementKeyCertificate = node.ekCert.Raw })
		result, err := verifier(t, roots, inter).Verify(t.Context(), ev, nonce)
		if err != nil {
			t.Fatal(err)
		}
		challenge, _, err := result.Activation.Challenge()
		if err != nil {
			t.Fatal(err)
		}
		for name, a := range map[string]*tpmattester.QuoteAttester{"AK's TPM": stranger.attester, "EK's TPM": node.attester} {
			if _, err := a.Activate(t.Context(), challenge); err == nil {
				t.Fatalf("the %s answered a challenge for an AK and EK of two TPMs", name)
			}
		}
	})

	testCA := testkit.NewCA(t, "test TPM manufacturer")
	testRoots := x509.NewCertPool()
	testRoots.AddCert(testCA.Cert)
	expired := swtpmtest.ReissueEK(t, node.ekCert.Raw, testCA, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour), true)
	notEK := swtpmtest.ReissueEK(t, node.ekCert.Raw, testCA, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), false)
	for _, tt := range []struct {
		name     string
		a        *tpmattester.QuoteAttester
		change   func(*attestationv1.TPMEvidence)
		roots    *x509.CertPool
		says     string
		wantKind error
	}{
		{"EK from another manufacturer", foreign.attester, nil, roots, "certificate signed by unknown authority", attestation.ErrUntrustedKey},
		{"expired EK certificate", node.attester, func(e *attestationv1.TPMEvidence) { e.EndorsementKeyCertificate = expired }, testRoots, "expired", attestation.ErrUntrustedKey},
		{"not an EK certificate", node.attester, func(e *attestationv1.TPMEvidence) { e.EndorsementKeyCertificate = notEK }, testRoots, "not an EK certificate", attestation.ErrUntrustedKey},
		{"no EK certificate", node.attester, func(e *attestationv1.TPMEvidence) { e.EndorsementKeyCertificate = nil }, roots, "carries no EK certificate", attestation.ErrUntrustedKey},
		{"garbage EK certificate", node.attester, func(e *attestationv1.TPMEvidence) { e.EndorsementKeyCertificate = []byte("junk") }, roots, "EK certificate", attestation.ErrMalformed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nonce := newNonce(t)
			_, err := verifier(t, tt.roots, inter).Verify(t.Context(), attest(t, tt.a, nonce, tt.change), nonce)
			if !errors.Is(err, tt.wantKind) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("got %v, want %v saying %q", err, tt.wantKind, tt.says)
			}
		})
	}

	t.Run("pinned AK with an EK certificate still asks for activation", func(t *testing.T) {
		v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: testPCRs, Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{node.attester.AttestationKey()}}}, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		nonce := newNonce(t)
		result, err := v.Verify(t.Context(), attest(t, node.attester, nonce, nil), nonce)
		if err != nil {
			t.Fatal(err)
		}
		if result.Activation == nil || result.Endorsement != "pinned" {
			t.Fatalf("activation %v, endorsement %q; want an activation (the attester waits for its challenge) and pinned", result.Activation, result.Endorsement)
		}
		// The certificate's chain was not checked: it proves no identity.
		if result.EKCertificate != nil || len(result.Identities()) != 1 {
			t.Fatalf("EK certificate %+v, identities %q; want only the AK", result.EKCertificate, result.Identities())
		}
	})
}

// TestManufacturedAttesterRefusesATPMWithoutEKCertificate: a TPM without
// an EK certificate cannot send one; the error says what to do.
func TestManufacturedAttesterRefusesATPMWithoutEKCertificate(t *testing.T) {
	sw, err := swtpm.Start(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	rw, err := sw.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	_, err = tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs, EKCertificate: tpmattester.EKCertificateRequired})
	if err == nil || !strings.Contains(err.Error(), "no RSA EK certificate") || !strings.Contains(err.Error(), "pin its attestation key") {
		t.Fatalf("got %v, want the missing EK certificate named and the alternative", err)
	}
}
