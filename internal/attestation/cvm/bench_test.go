package cvm_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"slices"
	"testing"

	"github.com/google/go-sev-guest/abi"
	tdxabi "github.com/google/go-tdx-guest/abi"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/cvm"
)

// BenchmarkVerification compares, per confidential VM variant, the
// verification of genuine evidence (test devices: go-sev-guest's test AMD
// hierarchy, a test Intel hierarchy; the vTPM on the in-process simulator)
// with the raw signature checks inside it: the vTPM quote's ECDSA P-256
// signature, and for sev-snp the report's ECDSA P-384 signature under the
// VCEK and the VCEK ← ASK ← ARK chain (RSA-PSS 4096), for tdx the quote's
// ECDSA P-256 signature under the attestation key, the QE report's under
// the PCK certificate and the PCK ← intermediate ← root chain. Quoting is
// outside the loop.
func BenchmarkVerification(b *testing.B) {
	vtpm := vTPM(b)
	for _, p := range platforms(b) {
		launch := snpLaunch
		if p.variant == attestation.VariantTDX {
			launch = tdxMRTD
		}
		a, err := cvm.NewCompositeAttester(p.attester(b, launch, false), vtpm)
		if err != nil {
			b.Fatal(err)
		}
		evidence, err := a.Attest(context.Background(), tlsKeyHash, nonce)
		if err != nil {
			b.Fatal(err)
		}
		v := verifier(b, p, nil)
		b.Run(string(p.variant)+"/verify-evidence", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(context.Background(), evidence, nonce); err != nil {
					b.Fatal(err)
				}
			}
		})
		ev := &attestationv1.ConfidentialVMEvidence{}
		if err := proto.Unmarshal(evidence, ev); err != nil {
			b.Fatal(err)
		}
		quote := quoteSignatureCheck(b, ev.GetVtpm())
		var hardware func()
		if p.variant == attestation.VariantSNP {
			hardware = snpSignatureChecks(b, ev.GetHardware())
		} else {
			hardware = tdxSignatureChecks(b, ev.GetHardware())
		}
		b.Run(string(p.variant)+"/raw-signatures", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				quote()
				hardware()
			}
		})
	}
}

// quoteSignatureCheck checks the vTPM quote's ECDSA signature under its AK.
func quoteSignatureCheck(b *testing.B, evidence []byte) func() {
	ev := &attestationv1.TPMEvidence{}
	if err := proto.Unmarshal(evidence, ev); err != nil {
		b.Fatal(err)
	}
	pub, err := tpm2.DecodePublic(ev.GetAttestationKey())
	if err != nil {
		b.Fatal(err)
	}
	key, err := pub.Key()
	if err != nil {
		b.Fatal(err)
	}
	sig, err := tpm2.DecodeSignature(bytes.NewBuffer(ev.GetSignature()))
	if err != nil {
		b.Fatal(err)
	}
	return func() {
		digest := sha256.Sum256(ev.GetQuote())
		if !ecdsa.Verify(key.(*ecdsa.PublicKey), digest[:], sig.ECC.R, sig.ECC.S) {
			b.Fatal("quote signature does not verify")
		}
	}
}

// snpSignatureChecks checks the report's signature under the VCEK and the
// VCEK's chain, with the certificates the evidence carries.
func snpSignatureChecks(b *testing.B, evidence []byte) func() {
	ev := &attestationv1.SNPEvidence{}
	if err := proto.Unmarshal(evidence, ev); err != nil {
		b.Fatal(err)
	}
	table := &abi.CertTable{}
	if err := table.Unmarshal(ev.GetCertificateTable()); err != nil {
		b.Fatal(err)
	}
	chain := table.Proto()
	var certs []*x509.Certificate
	for _, der := range [][]byte{chain.GetVcekCert(), chain.GetAskCert(), chain.GetArkCert()} {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			b.Fatal(err)
		}
		certs = append(certs, c)
	}
	sig, err := abi.ReportToSignatureDER(ev.GetReport())
	if err != nil {
		b.Fatal(err)
	}
	signed := abi.SignedComponent(ev.GetReport())
	return func() {
		if err := certs[0].CheckSignature(x509.ECDSAWithSHA384, signed, sig); err != nil {
			b.Fatal(err)
		}
		for i := 0; i+1 < len(certs); i++ {
			if err := certs[i].CheckSignatureFrom(certs[i+1]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// tdxSignatureChecks checks the quote's signature under its attestation
// key, the QE report's under the PCK certificate, and the PCK chain.
func tdxSignatureChecks(b *testing.B, evidence []byte) func() {
	ev := &attestationv1.TDXEvidence{}
	if err := proto.Unmarshal(evidence, ev); err != nil {
		b.Fatal(err)
	}
	parsed, err := tdxabi.QuoteToProto(ev.GetQuote())
	if err != nil {
		b.Fatal(err)
	}
	q := parsed.(*pb.QuoteV4)
	header, err := tdxabi.HeaderToAbiBytes(q.GetHeader())
	if err != nil {
		b.Fatal(err)
	}
	body, err := tdxabi.TdQuoteBodyToAbiBytes(q.GetTdQuoteBody())
	if err != nil {
		b.Fatal(err)
	}
	signedQuote := slices.Concat(header, body)
	qe := q.GetSignedData().GetCertificationData().GetQeReportCertificationData()
	qeReport, err := tdxabi.EnclaveReportToAbiBytes(qe.GetQeReport())
	if err != nil {
		b.Fatal(err)
	}
	var certs []*x509.Certificate
	for rest := qe.GetPckCertificateChainData().GetPckCertChain(); ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			b.Fatal(err)
		}
		certs = append(certs, c)
	}
	attKey := q.GetSignedData().GetEcdsaAttestationKey()
	att, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append([]byte{4}, attKey...))
	if err != nil {
		b.Fatal(err)
	}
	verifyRS := func(pub *ecdsa.PublicKey, msg, rs []byte) {
		digest := sha256.Sum256(msg)
		if !ecdsa.Verify(pub, digest[:], new(big.Int).SetBytes(rs[:32]), new(big.Int).SetBytes(rs[32:])) {
			b.Fatal("signature does not verify")
		}
	}
	return func() {
		verifyRS(att, signedQuote, q.GetSignedData().GetSignature())
		verifyRS(certs[0].PublicKey.(*ecdsa.PublicKey), qeReport, qe.GetQeReportSignature())
		for i := 0; i+1 < len(certs); i++ {
			if err := certs[i].CheckSignatureFrom(certs[i+1]); err != nil {
				b.Fatal(err)
			}
		}
	}
}
