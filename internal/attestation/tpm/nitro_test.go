package tpm_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// vaportpmFixture is lockboot/vaportpm's recorded NitroTPM attestation
// (testdata/nitro/README.md): the nonce, the SHA-384 PCRs, the ECC P-256
// AK, its TPM2_Quote over the SHA-384 bank, and the Nitro hypervisor's
// attestation document naming that AK and nonce.
type vaportpmFixture struct {
	Nonce     string                             `json:"nonce"`
	PCRs      struct{ SHA384 map[string]string } `json:"pcrs"`
	AKPubkeys struct {
		ECCP256 struct{ X, Y string } `json:"ecc_p256"`
	} `json:"ak_pubkeys"`
	Attestation struct {
		TPM struct {
			ECCP256 struct {
				AttestData string `json:"attest_data"`
				Signature  string `json:"signature"`
			} `json:"ecc_p256"`
		} `json:"tpm"`
		Nitro struct {
			Document string `json:"document"`
		} `json:"nitro"`
	} `json:"attestation"`
}

// recordedNitro turns the fixture into TPMEvidence as a Gatehouse attester
// sends it: the quote's DER ECDSA signature as a TPMT_SIGNATURE, the AK's
// TPMT_PUBLIC made from the recorded point in go-tpm-tools' ECC AK
// template (the fixture records the point, not the TPMT_PUBLIC; the
// verifier trusts the key the document names, not these bytes), the
// document in nitro_document. It returns the evidence, the nonce (the
// quote's extraData and the document's nonce) and the SHA-384 PCRs.
func recordedNitro(t testing.TB) (evidence, nonce []byte, pcrs measurements.M) {
	t.Helper()
	var f vaportpmFixture
	if err := json.Unmarshal(readTestdata(t, "nitro/test-nitro-fixture.json"), &f); err != nil {
		t.Fatal(err)
	}
	unhex := func(s string) []byte {
		t.Helper()
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	values := map[uint32][]byte{}
	pcrs = measurements.M{}
	for index, value := range f.PCRs.SHA384 {
		i, err := strconv.Atoi(index)
		if err != nil {
			t.Fatal(err)
		}
		values[uint32(i)] = unhex(value)
		pcrs[uint32(i)] = measurements.Measurement{Expected: unhex(value)}
	}
	var sig struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(unhex(f.Attestation.TPM.ECCP256.Signature), &sig); err != nil {
		t.Fatal(err)
	}
	rawSig, err := tpm2.Signature{Alg: tpm2.AlgECDSA, ECC: &tpm2.SignatureECC{HashAlg: tpm2.AlgSHA256, R: sig.R, S: sig.S}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	template := client.AKTemplateECC()
	template.ECCParameters.Point = tpm2.ECPoint{XRaw: unhex(f.AKPubkeys.ECCP256.X), YRaw: unhex(f.AKPubkeys.ECCP256.Y)}
	akPublic, err := template.Encode()
	if err != nil {
		t.Fatal(err)
	}
	evidence, err = proto.Marshal(&attestationv1.TPMEvidence{
		Quote: unhex(f.Attestation.TPM.ECCP256.AttestData), Signature: rawSig,
		PcrHashAlgorithm: uint32(tpm2.AlgSHA384), Pcrs: values, AttestationKey: akPublic,
		NitroDocument: unhex(f.Attestation.Nitro.Document),
	})
	if err != nil {
		t.Fatal(err)
	}
	return evidence, unhex(f.Nonce), pcrs
}

// nitroDocumentTime is when the recorded document was signed; its leaf
// certificate lives three hours from then.
var nitroDocumentTime = time.Date(2026, time.February, 3, 10, 12, 30, 0, time.UTC)

// TestNitroRecordedEvidence: a real NitroTPM attestation (vaportpm's
// fixture: instance i-01cfb383223e42522, us-east-1, 2026-02-03) verifies
// through the production verifier with the AWS Nitro root embedded in
// Gatehouse: the document's COSE_Sign1 signature under its certificate,
// that certificate's chain through the document's CA bundle to the root,
// the document naming the AK that signed the quote and the quote's
// binding as its nonce, its SHA-384 PCRs the reference values, and the
// quote over the SHA-384 bank. The recording was made for vaportpm's
// nonce, so the test calls VerifyExtraData with it, at a time the
// document's certificate was valid. Each refusal is one thing an attacker
// would change.
func TestNitroRecordedEvidence(t *testing.T) {
	evidence, nonce, pcrs := recordedNitro(t)
	all := make([]int, 24)
	for i := range all {
		all[i] = i
	}
	at := func(tm time.Time) func() time.Time { return func() time.Time { return tm } }
	verify := func(t *testing.T, nitro tpm.NitroEndorsement, now time.Time, evidence, extraData []byte) (*attestation.Result, error) {
		t.Helper()
		if nitro.ReferenceValues == nil {
			nitro.ReferenceValues = pcrs
		}
		v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: all, ReferenceValues: pcrs, Endorsement: tpm.Endorsement{Nitro: &nitro}}, at(now))
		if err != nil {
			t.Fatal(err)
		}
		return v.VerifyExtraData(t.Context(), evidence, extraData)
	}
	result, err := verify(t, tpm.NitroEndorsement{AnyInstance: true}, nitroDocumentTime, evidence, nonce)
	if err != nil {
		t.Fatalf("recorded NitroTPM evidence: %v", err)
	}
	if !strings.HasPrefix(result.Endorsement, "aws-nitrotpm instance=i-01cfb383223e42522 module=i-01cfb383223e42522-tpm") ||
		!strings.HasPrefix(result.Identity, attestation.PrefixAK) || len(result.Measurements[0]) != 48 {
		t.Fatalf("result: endorsement %q, identity %q", result.Endorsement, result.Identity)
	}
	if hw := result.Hardware; hw == nil || hw.Identity != attestation.PrefixAWSInstance+"i-01cfb383223e42522" || len(hw.Measurements) != 24 ||
		!slices.Contains(result.Identities(), hw.Identity) {
		t.Fatalf("the document's result %+v, identities %q", hw, result.Identities())
	}
	if _, err := verify(t, tpm.NitroEndorsement{InstanceIDs: []string{"i-0aaaaaaaaaaaaaaaa", "i-01cfb383223e42522"}}, nitroDocumentTime, evidence, nonce); err != nil {
		t.Fatalf("the admitted instance: %v", err)
	}
	// Capturing reference values from a golden instance: any PCRs, the
	// document's in the result.
	v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: all, Endorsement: tpm.Endorsement{Nitro: &tpm.NitroEndorsement{AnyReferenceValues: true, AnyInstance: true}}}, at(nitroDocumentTime))
	if err != nil {
		t.Fatal(err)
	}
	if captured, err := v.VerifyExtraData(t.Context(), evidence, nonce); err != nil || !bytes.Equal(captured.Hardware.Measurements[4], pcrs[4].Expected) {
		t.Fatalf("capture: %v", err)
	}
	if _, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: all, Endorsement: tpm.Endorsement{Nitro: &tpm.NitroEndorsement{ReferenceValues: pcrs, AnyReferenceValues: true, AnyInstance: true}}}, time.Now); err == nil {
		t.Fatal("reference values and any reference values both accepted")
	}

	otherPCR := measurements.M{}
	for i, m := range pcrs {
		otherPCR[i] = m
	}
	otherPCR[4] = measurements.Measurement{Expected: make([]byte, 48)}
	tamperedDocument := mutate(t, evidence, func(e *attestationv1.TPMEvidence) {
		i := strings.Index(string(e.NitroDocument), "nitrotpm_pcrs")
		e.NitroDocument[i+40] ^= 1 // a byte of PCR 0's value
	})
	otherKey := mutate(t, evidence, func(e *attestationv1.TPMEvidence) {
		ak, err := client.AKTemplateECC().Encode()
		if err != nil {
			t.Fatal(err)
		}
		other, err := tpm2.DecodePublic(ak)
		if err != nil {
			t.Fatal(err)
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		other.ECCParameters.Point = tpm2.ECPoint{XRaw: key.X.FillBytes(make([]byte, 32)), YRaw: key.Y.FillBytes(make([]byte, 32))}
		if e.AttestationKey, err = other.Encode(); err != nil {
			t.Fatal(err)
		}
	})
	for _, tt := range []struct {
		name      string
		nitro     tpm.NitroEndorsement
		now       time.Time
		evidence  []byte
		extraData []byte
		want      error
		says      string
	}{
		{"another root", tpm.NitroEndorsement{AnyInstance: true, Roots: pool(t, "swtpm-localca-root.pem")}, nitroDocumentTime, evidence, nonce, attestation.ErrUntrustedKey, "does not chain to the AWS Nitro root"},
		{"a tampered document (a PCR changed)", tpm.NitroEndorsement{AnyInstance: true}, nitroDocumentTime, tamperedDocument, nonce, attestation.ErrSignature, "signature does not verify"},
		{"after the document's certificate expired", tpm.NitroEndorsement{AnyInstance: true}, nitroDocumentTime.Add(4 * time.Hour), evidence, nonce, attestation.ErrUntrustedKey, "expired"},
		{"another binding (a replay for another handshake)", tpm.NitroEndorsement{AnyInstance: true}, nitroDocumentTime, evidence, make([]byte, 32), attestation.ErrNonce, "another handshake"},
		{"a quote by a key the document does not name", tpm.NitroEndorsement{AnyInstance: true}, nitroDocumentTime, otherKey, nonce, attestation.ErrUntrustedKey, "another public key"},
		{"no document", tpm.NitroEndorsement{AnyInstance: true}, nitroDocumentTime, mutate(t, evidence, func(e *attestationv1.TPMEvidence) { e.NitroDocument = nil }), nonce, attestation.ErrUntrustedKey, "no NitroTPM attestation document"},
		{"another boot (SHA-384 reference values)", tpm.NitroEndorsement{AnyInstance: true, ReferenceValues: otherPCR}, nitroDocumentTime, evidence, nonce, attestation.ErrMeasurement, "NitroTPM document"},
		{"an instance the policy does not admit", tpm.NitroEndorsement{InstanceIDs: []string{"i-0aaaaaaaaaaaaaaaa"}}, nitroDocumentTime, evidence, nonce, attestation.ErrPolicy, "i-01cfb383223e42522"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := verify(t, tt.nitro, tt.now, tt.evidence, tt.extraData)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("error = %v, want %v saying %q", err, tt.want, tt.says)
			}
		})
	}
	t.Run("a policy admitting neither instance IDs nor any instance", func(t *testing.T) {
		if _, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: all, Endorsement: tpm.Endorsement{Nitro: &tpm.NitroEndorsement{ReferenceValues: pcrs}}}, time.Now); err == nil {
			t.Fatal("accepted")
		}
	})
	t.Run("Verify with a nonce refuses the recording (made for vaportpm's nonce)", func(t *testing.T) {
		v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: all, ReferenceValues: pcrs, Endorsement: tpm.Endorsement{Nitro: &tpm.NitroEndorsement{ReferenceValues: pcrs, AnyInstance: true}}}, at(nitroDocumentTime))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(t.Context(), evidence, make([]byte, attestation.NonceSize)); !errors.Is(err, attestation.ErrNonce) {
			t.Fatalf("error = %v, want %v", err, attestation.ErrNonce)
		}
	})
}

// FuzzNitroDocument feeds the verifier mutations of the recorded NitroTPM
// evidence, its document in particular (COSE_Sign1, CBOR, certificates):
// it must never panic, and whatever verifies is the recorded AK.
func FuzzNitroDocument(f *testing.F) {
	evidence, nonce, pcrs := recordedNitro(f)
	f.Add(evidence)
	all := make([]int, 24)
	for i := range all {
		all[i] = i
	}
	v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: all, ReferenceValues: pcrs, Endorsement: tpm.Endorsement{Nitro: &tpm.NitroEndorsement{ReferenceValues: pcrs, AnyInstance: true}}},
		func() time.Time { return nitroDocumentTime })
	if err != nil {
		f.Fatal(err)
	}
	want, err := v.VerifyExtraData(f.Context(), evidence, nonce)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ev []byte) {
		result, err := v.VerifyExtraData(t.Context(), ev, nonce)
		if err == nil && result.Identity != want.Identity {
			t.Fatalf("evidence verified as %s", result.Identity)
		}
	})
}
