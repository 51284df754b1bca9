package tpm_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
)

// BenchmarkVerification compares, in one run, a full verification of
// simulator-TPM evidence (with event log and reference values) with the raw
// ECDSA P-256 verification of the quote signature that it contains. The
// evidence is made once; the benchmark measures the verifier only.
func BenchmarkVerification(b *testing.B) {
	f := newFixture(b)
	nonce := newNonce(b)
	evidence, err := f.attester.Attest(context.Background(), []byte("key hash"), nonce)
	if err != nil {
		b.Fatal(err)
	}
	v := f.verifier(b)
	b.Run("verify-evidence", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := v.Verify(context.Background(), evidence, nonce); err != nil {
				b.Fatal(err)
			}
		}
	})
	ev := &attestationv1.TPMEvidence{}
	if err := proto.Unmarshal(evidence, ev); err != nil {
		b.Fatal(err)
	}
	pub := f.attester.AttestationKey().(*ecdsa.PublicKey)
	sig, err := tpm2.DecodeSignature(bytes.NewBuffer(ev.GetSignature()))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("raw-signature", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			digest := sha256.Sum256(ev.GetQuote())
			if !ecdsa.Verify(pub, digest[:], sig.ECC.R, sig.ECC.S) {
				b.Fatal("signature does not verify")
			}
		}
	})
}

// BenchmarkAttest measures quoting on the in-process simulator: the cost the
// test rig itself adds to every attested handshake.
func BenchmarkAttest(b *testing.B) {
	f := newFixture(b)
	nonce := newNonce(b)
	for b.Loop() {
		if _, err := f.attester.Attest(context.Background(), []byte("key hash"), nonce); err != nil {
			b.Fatal(err)
		}
	}
}
