package tpm_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// fluoriteDocument is mithril-security/fluorite's Trusted Launch
// attestation document (testdata/azure/README.md): a TPM2_Quote
// (TPMS_ATTEST and TPMT_SIGNATURE, base64), the 24 SHA-256 PCRs it covers,
// and the AK certificate chain (base64 DER: leaf, issuing CA, root).
type fluoriteDocument struct {
	Quote struct {
		Message   string `json:"message"`
		Signature string `json:"signature"`
		PCRData   struct {
			Data [][2]json.RawMessage `json:"data"`
		} `json:"pcr_data"`
	} `json:"quote"`
	AKCertChain []string `json:"ak_cert_chain"`
}

// recordedAzure returns a recorded Azure Trusted Launch attestation
// (testdata/azure) as TPMEvidence, the PCRs its quote covers, and its AK
// certificate (the leaf alone, as the vTPM's NV index holds it: the
// issuing CA comes from the verifier's embedded ones).
func recordedAzure(t testing.TB, file string) (evidence []byte, pcrs []int, leaf *x509.Certificate) {
	t.Helper()
	var doc fluoriteDocument
	if err := json.Unmarshal(readTestdata(t, "azure/"+file), &doc); err != nil {
		t.Fatal(err)
	}
	b64 := func(s string) []byte {
		t.Helper()
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	leafDER := b64(doc.AKCertChain[0])
	leaf, err := x509.ParseCertificate(leafDER)
	if err != nil {
		t.Fatal(err)
	}
	values := map[uint32][]byte{}
	for _, bank := range doc.Quote.PCRData.Data {
		var alg string
		var slots struct {
			Bank map[string]string `json:"bank"`
		}
		if err := json.Unmarshal(bank[0], &alg); err != nil {
			t.Fatal(err)
		}
		if alg != "Sha256" {
			continue
		}
		if err := json.Unmarshal(bank[1], &slots); err != nil {
			t.Fatal(err)
		}
		for slot, value := range slots.Bank {
			index, err := strconv.Atoi(strings.TrimPrefix(slot, "Slot"))
			if err != nil {
				t.Fatal(err)
			}
			if values[uint32(index)], err = hex.DecodeString(value); err != nil {
				t.Fatal(err)
			}
			pcrs = append(pcrs, index)
		}
	}
	ev, err := proto.Marshal(&attestationv1.TPMEvidence{
		Quote: b64(doc.Quote.Message), Signature: b64(doc.Quote.Signature),
		PcrHashAlgorithm: uint32(tpm2.AlgSHA256), Pcrs: values,
		AttestationKey:             synthesisedAzureAKPublic(t, leaf),
		AttestationKeyCertificates: [][]byte{leafDER},
	})
	if err != nil {
		t.Fatal(err)
	}
	return ev, pcrs, leaf
}

// synthesisedAzureAKPublic builds, FOR THE TEST ONLY, a TPMT_PUBLIC for the
// AK that cert certifies. The recording does not carry the AK's public
// area, which Gatehouse's evidence needs (TPMEvidence.attestation_key); a
// node sends the real one (TPM2_ReadPublic of the AK at 0x81000003). This
// one is SYNTHESISED: the certificate's RSA key in the template of
// Microsoft's OpenHCL AK (openvmm tpm_helper.rs ak_pub_template: a
// restricted RSASSA-SHA256 signing key, attributes 0x50472). It is not
// byte-for-byte the vTPM's (its Name does not match the quote's
// qualifiedSigner, which the verifier does not check); what the verifier
// relies on, the key that signed the quote and that the certificate
// certifies, comes from the certificate.
func synthesisedAzureAKPublic(t testing.TB, cert *x509.Certificate) []byte {
	t.Helper()
	pub, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok {
		t.Fatalf("the Azure AK certificate holds a %T", cert.PublicKey)
	}
	return swtpmtest.AzureAKPublic(t, pub)
}

// TestAzureTrustedLaunchRecordedEvidence: two real Azure Trusted Launch
// vTPM quotes, signed by the AK Azure provisions and certifies
// (testdata/azure/README.md), verify through the production verifier with
// the embedded Azure vTPM root and issuing CAs, the evidence carrying only
// the leaf certificate; the result names the certificate. Their
// certificates have expired, so the verifier's clock is fixed at a time
// they were valid. The recorded quotes carry no nonce (their extraData is
// empty), so VerifyExtraData checks them against nil. Refused: another
// root, a tampered PCR, a tampered signature, a time after the
// certificate expired, the certificate of another AK, an ID the policy
// does not admit, the evidence checked against a nonce, and a policy that
// neither lists IDs nor admits any VM.
func TestAzureTrustedLaunchRecordedEvidence(t *testing.T) {
	evidence, pcrs, leaf := recordedAzure(t, "azure_trusted_launch_vm_attestation_document.json")
	older, _, olderLeaf := recordedAzure(t, "azure_trusted_launch_vm_attestation_document_expired.json")
	at := func(date string) func() time.Time {
		tm, err := time.Parse(time.DateOnly, date)
		if err != nil {
			t.Fatal(err)
		}
		return func() time.Time { return tm }
	}
	const id = "2d056151df3d"
	verify := func(t *testing.T, azure tpm.AzureEndorsement, now func() time.Time, evidence, extraData []byte) (*attestation.Result, error) {
		t.Helper()
		v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: pcrs, Endorsement: tpm.Endorsement{Azure: &azure}}, now)
		if err != nil {
			t.Fatal(err)
		}
		return v.VerifyExtraData(t.Context(), evidence, extraData)
	}

	if len(pcrs) != 24 || leaf.Subject.CommonName != id+".TrustedVM.Azure.Microsoft" || leaf.Issuer.CommonName != "Global Virtual TPM CA - 01" {
		t.Fatalf("recording: %d PCRs, certificate %q from %q", len(pcrs), leaf.Subject, leaf.Issuer)
	}
	result, err := verify(t, tpm.AzureEndorsement{AnyVM: true}, at("2025-06-01"), evidence, nil)
	if err != nil {
		t.Fatalf("recorded Azure Trusted Launch evidence: %v", err)
	}
	want := `azure-trusted-launch id=` + id + ` subject="CN=` + id + `.TrustedVM.Azure.Microsoft" issuer="CN=Global Virtual TPM CA - 01" serial=d2a198936cc1e48a33b0e80f835fbc5a`
	if result.Endorsement != want {
		t.Fatalf("endorsement %q, want %q", result.Endorsement, want)
	}
	if !strings.HasPrefix(result.Identity, "tpm-ak:sha256:") || len(result.Measurements) != 24 {
		t.Fatalf("identity %q, %d measurements", result.Identity, len(result.Measurements))
	}
	if _, err := verify(t, tpm.AzureEndorsement{CertificateIDs: []string{"ceda709e0366", id}}, at("2025-06-01"), evidence, nil); err != nil {
		t.Fatalf("the certificate's own ID admitted: %v", err)
	}
	// The second recording, a year older, from another VM.
	if result, err := verify(t, tpm.AzureEndorsement{AnyVM: true}, at("2024-06-01"), older, nil); err != nil ||
		!strings.HasPrefix(result.Endorsement, "azure-trusted-launch id=ceda709e0366 ") {
		t.Fatalf("the older recording: %v", err)
	}

	otherRoots := pool(t, "swtpm-localca-root.pem")
	tamperedPCR := mutate(t, evidence, func(e *attestationv1.TPMEvidence) { e.Pcrs[0] = make([]byte, 32) })
	tamperedSignature := mutate(t, evidence, func(e *attestationv1.TPMEvidence) { e.Signature[len(e.Signature)-1] ^= 1 })
	otherAK := mutate(t, evidence, func(e *attestationv1.TPMEvidence) { e.AttestationKeyCertificates = [][]byte{olderLeaf.Raw} })
	for _, tt := range []struct {
		name      string
		azure     tpm.AzureEndorsement
		now       string
		evidence  []byte
		extraData []byte
		want      error
		says      string
	}{
		{"another root", tpm.AzureEndorsement{AnyVM: true, Roots: otherRoots}, "2025-06-01", evidence, nil, attestation.ErrUntrustedKey, "unknown authority"},
		{"tampered PCR", tpm.AzureEndorsement{AnyVM: true}, "2025-06-01", tamperedPCR, nil, attestation.ErrSignature, "digest"},
		{"tampered quote signature", tpm.AzureEndorsement{AnyVM: true}, "2025-06-01", tamperedSignature, nil, attestation.ErrSignature, "does not verify"},
		{"expired certificate", tpm.AzureEndorsement{AnyVM: true}, "2025-11-01", evidence, nil, attestation.ErrUntrustedKey, "expired"},
		{"certificate of another AK", tpm.AzureEndorsement{AnyVM: true}, "2024-06-01", otherAK, nil, attestation.ErrUntrustedKey, "another key"},
		{"ID not admitted", tpm.AzureEndorsement{CertificateIDs: []string{"ceda709e0366"}}, "2025-06-01", evidence, nil, attestation.ErrPolicy, "an ID the policy does not admit"},
		{"checked against a nonce", tpm.AzureEndorsement{AnyVM: true}, "2025-06-01", evidence, []byte{1}, attestation.ErrNonce, "extraData"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := verify(t, tt.azure, at(tt.now), tt.evidence, tt.extraData)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("got %v, want %v saying %q", err, tt.want, tt.says)
			}
		})
	}

	for _, azure := range []tpm.AzureEndorsement{{}, {AnyVM: true, CertificateIDs: []string{id}}} {
		if _, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: pcrs, Endorsement: tpm.Endorsement{Azure: &azure}}, time.Now); err == nil ||
			!strings.Contains(err.Error(), "exactly one of certificate IDs and any-VM") {
			t.Fatalf("Azure policy %+v: %v, want refused", azure, err)
		}
	}
}

// TestAzureAttester: on a TPM provisioned as Azure provisions a Trusted
// Launch vTPM (an RSA AK at persistent handle 0x81000003, its certificate
// in NV index 0x01c101d0, which is larger than the certificate; issued
// here by a test CA standing in for Azure's), the attester sends the
// certificate alone and the azureTrustedLaunch policy trusts the VM's ID;
// another ID is refused. A vTPM without the AK says what is missing; one
// without the certificate (a confidential VM, whose HCL report binds the
// key instead) quotes without it, and Trusted Launch refuses that.
func TestAzureAttester(t *testing.T) {
	rw := newSimulator(t)
	if _, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKAzure}); err == nil ||
		!strings.Contains(err.Error(), "Trusted Launch or confidential VM") {
		t.Fatalf("a vTPM without the Azure AK: %v", err)
	}
	ak, err := client.NewKey(rw, tpm2.HandleOwner, client.AKTemplateRSA())
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm2.EvictControl(rw, "", tpm2.HandleOwner, ak.Handle(), tpmattester.AzureAKHandle); err != nil {
		t.Fatal(err)
	}
	akPub := ak.PublicKey()
	ak.Close()

	ca := testkit.NewCA(t, "test Azure vTPM CA")
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	verify := func(t *testing.T, a *tpmattester.QuoteAttester, ids ...string) (*attestation.Result, error) {
		t.Helper()
		nonce := newNonce(t)
		evidence, err := a.Attest(t.Context(), []byte("tls key"), nonce)
		if err != nil {
			t.Fatal(err)
		}
		v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: testPCRs, Endorsement: tpm.Endorsement{Azure: &tpm.AzureEndorsement{CertificateIDs: ids, Roots: roots}}}, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		return v.Verify(t.Context(), evidence, nonce)
	}
	open := func(t *testing.T) *tpmattester.QuoteAttester {
		t.Helper()
		a, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKAzure})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	if _, err := verify(t, open(t), "abc123"); !errors.Is(err, attestation.ErrUntrustedKey) {
		t.Fatalf("without an AK certificate: error = %v, want %v", err, attestation.ErrUntrustedKey)
	}

	leaf := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "abc123.TrustedVM.Azure.Microsoft"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		UnknownExtKeyUsage: []asn1.ObjectIdentifier{{2, 23, 133, 8, 3}}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca.Cert, akPub, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	nvWrite(t, rw, uint32(tpmattester.AzureAKCertificateNV), append(leafDER, make([]byte, 200)...))
	a := open(t)
	result, err := verify(t, a, "abc123")
	if err != nil {
		t.Fatalf("Azure AK with its certificate: %v", err)
	}
	if !strings.HasPrefix(result.Endorsement, "azure-trusted-launch id=abc123 ") {
		t.Fatalf("endorsement %q", result.Endorsement)
	}
	if _, err := verify(t, a, "another"); !errors.Is(err, attestation.ErrPolicy) {
		t.Fatalf("another ID: error = %v, want %v", err, attestation.ErrPolicy)
	}
}
