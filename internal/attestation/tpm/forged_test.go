package tpm

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// forger signs arbitrary TPMS_ATTEST structures with a software key whose
// TPMT_PUBLIC claims any attributes. It models a pinned key that misbehaves,
// so each check after the endorsement can be exercised alone.
type forger struct {
	key *ecdsa.PrivateKey
	pub tpm2.Public
}

func newForger(t *testing.T, attrs tpm2.KeyProp) *forger {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &forger{key: key, pub: tpm2.Public{
		Type: tpm2.AlgECC, NameAlg: tpm2.AlgSHA256, Attributes: attrs,
		ECCParameters: &tpm2.ECCParams{
			Sign:    &tpm2.SigScheme{Alg: tpm2.AlgECDSA, Hash: tpm2.AlgSHA256},
			CurveID: tpm2.CurveNISTP256,
			Point:   tpm2.ECPoint{XRaw: key.X.FillBytes(make([]byte, 32)), YRaw: key.Y.FillBytes(make([]byte, 32))},
		},
	}}
}

// evidence builds TPMEvidence for a quote over pcrs (all zero values) with
// the given magic and type, signed with hashAlg.
func (f *forger) evidence(t *testing.T, nonce []byte, magic uint32, typ tpmutil.Tag, hashAlg tpm2.Algorithm, pcrs []int) []byte {
	t.Helper()
	values := map[uint32][]byte{}
	digest := sha256.New()
	for _, pcr := range pcrs {
		values[uint32(pcr)] = make([]byte, 32)
		digest.Write(values[uint32(pcr)])
	}
	att := tpm2.AttestationData{
		Magic: magic, Type: typ, QualifiedSigner: tpm2.Name{Handle: new(tpmutil.Handle)},
		ExtraData:         attestation.Binding256(nonce, nil),
		AttestedQuoteInfo: &tpm2.QuoteInfo{PCRSelection: tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: pcrs}, PCRDigest: digest.Sum(nil)},
	}
	if typ != tpm2.TagAttestQuote {
		att.AttestedQuoteInfo = nil
		att.AttestedCertifyInfo = &tpm2.CertifyInfo{Name: tpm2.Name{Handle: new(tpmutil.Handle)}, QualifiedName: tpm2.Name{Handle: new(tpmutil.Handle)}}
	}
	quote, err := att.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var h []byte
	if hashAlg == tpm2.AlgSHA1 {
		sum := sha1.Sum(quote) // forging a SHA-1 signature on purpose
		h = sum[:]
	} else {
		sum := sha256.Sum256(quote)
		h = sum[:]
	}
	r, s, err := ecdsa.Sign(rand.Reader, f.key, h)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := tpm2.Signature{Alg: tpm2.AlgECDSA, ECC: &tpm2.SignatureECC{HashAlg: hashAlg, R: r, S: s}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := f.pub.Encode()
	if err != nil {
		t.Fatal(err)
	}
	out, err := proto.Marshal(&attestationv1.TPMEvidence{
		Quote: quote, Signature: sig, PcrHashAlgorithm: uint32(tpm2.AlgSHA256), Pcrs: values, AttestationKey: pub,
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestVerifyRejectsForgedQuotes(t *testing.T) {
	pcrs := []int{0, 4}
	nonce := make([]byte, attestation.NonceSize)
	tests := []struct {
		name     string
		attrs    tpm2.KeyProp
		magic    uint32
		typ      tpmutil.Tag
		hash     tpm2.Algorithm
		wantErr  error
		wantText string
	}{
		{
			name: "well-formed forgery by a pinned key passes (control)", attrs: requiredAKAttributes,
			magic: tpmGeneratedValue, typ: tpm2.TagAttestQuote, hash: tpm2.AlgSHA256,
		},
		{
			name: "unrestricted attestation key", attrs: tpm2.FlagSign | tpm2.FlagFixedTPM | tpm2.FlagFixedParent | tpm2.FlagSensitiveDataOrigin,
			magic: tpmGeneratedValue, typ: tpm2.TagAttestQuote, hash: tpm2.AlgSHA256,
			wantErr: attestation.ErrUntrustedKey, wantText: "not a restricted, TPM-resident signing key",
		},
		{
			name: "quote without TPM_GENERATED magic", attrs: requiredAKAttributes,
			magic: 0xdeadbeef, typ: tpm2.TagAttestQuote, hash: tpm2.AlgSHA256,
			wantErr: attestation.ErrPolicy, wantText: "not TPM_GENERATED_VALUE",
		},
		{
			name: "attestation that is not a quote", attrs: requiredAKAttributes,
			magic: tpmGeneratedValue, typ: tpm2.TagAttestCertify, hash: tpm2.AlgSHA256,
			wantErr: attestation.ErrPolicy, wantText: "not TPM_ST_ATTEST_QUOTE",
		},
		{
			name: "SHA-1 signature", attrs: requiredAKAttributes,
			magic: tpmGeneratedValue, typ: tpm2.TagAttestQuote, hash: tpm2.AlgSHA1,
			wantErr: attestation.ErrPolicy, wantText: "signature uses SHA-1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newForger(t, tt.attrs)
			v, err := NewQuoteVerifier(QuotePolicy{PCRs: pcrs, Endorsement: Endorsement{PinnedKeys: []crypto.PublicKey{f.key.Public()}}}, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.Verify(context.Background(), f.evidence(t, nonce, tt.magic, tt.typ, tt.hash, pcrs), nonce)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("control case failed: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("error = %v, want %v containing %q", err, tt.wantErr, tt.wantText)
			}
		})
	}
}
