// Package tdx verifies "tdx" evidence: an Intel TDX quote, version 4 (Intel
// TDX DCAP Quote Generation Library and Quote Verification Library, rev. 0.9,
// appendix A.3), signed by the quoting enclave's attestation key, which the
// QE report certifies under the platform's PCK certificate, which chains to
// the Intel SGX Root CA. Signature and chain checks use
// github.com/google/go-tdx-guest.
//
// The attester side, which reads the TDX guest device, is in package
// tdxguest, so a verifier never links guest-device code.
package tdx

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/validate"
	"github.com/google/go-tdx-guest/verify"
	"github.com/google/go-tdx-guest/verify/trust"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// MeasurementSize is the size of MRTD and of each RTMR in bytes.
const MeasurementSize = 48

// tdAttributesDebug is bit 0 of TD_ATTRIBUTES: the TD is debuggable, its
// memory readable by the host (TDX module ABI spec, TDATTRIBUTES).
const tdAttributesDebug = 1

// TDQuotePolicy is the appraisal policy of a TDQuoteVerifier.
type TDQuotePolicy struct {
	// ReferenceValues: index 0 is MRTD, 1-4 are RTMR0-RTMR3, 48 bytes each.
	ReferenceValues measurements.M
	// AnyMRTD accepts any MRTD, with no reference value for index 0: only
	// to capture reference values from a golden node
	// (policy.Policy.KeyVerifier), never to admit one.
	AnyMRTD bool
	// MinimumTeeTcbSvn is the lowest acceptable TEE_TCB_SVN, compared per
	// byte (16 bytes); nil accepts any.
	MinimumTeeTcbSvn []byte
	// MrSeam, when set, is the expected measurement of the TDX module
	// (48 bytes); MrSignerSeam the expected signer of the module (48 bytes,
	// all zero for Intel's own modules).
	MrSeam, MrSignerSeam []byte
	// TdAttributes and Xfam, when set, are the exact TD_ATTRIBUTES and
	// XFAM (8 bytes each) the TD must have been launched with.
	TdAttributes, Xfam []byte
	// MinimumQeSvn and MinimumPceSvn are the lowest acceptable security
	// versions of the quoting enclave and the provisioning certification
	// enclave (quote header).
	MinimumQeSvn, MinimumPceSvn uint16
	// QeVendorID, when set, is the quoting enclave vendor (16 bytes;
	// Intel's is 939a7233f79c4ca9940a0db3957f0607).
	QeVendorID []byte
	// TrustedRoots verify the PCK chain; nil means the Intel SGX Root CA
	// embedded in go-tdx-guest.
	TrustedRoots *x509.CertPool
	// Collateral, when set, fetches Intel PCS collateral: the TCB info for
	// the platform's FMSPC (the TCB level of the platform and the TDX
	// module must be UpToDate), the QE identity (the quoting enclave must
	// be Intel's, at an UpToDate level), typically through a
	// collateral.Cache (its TDX form) so verification works offline once
	// cached. Nil: no collateral, only the quote's own chain.
	Collateral trust.HTTPSGetter
	// CheckRevocations checks the PCK CRL and the root CA CRL through
	// Collateral: a revoked PCK or intermediate certificate is refused.
	CheckRevocations bool
}

// TDQuoteVerifier verifies "tdx" evidence. Debuggable TDs are always refused.
type TDQuoteVerifier struct {
	policy TDQuotePolicy
	now    func() time.Time
}

// NewTDQuoteVerifier returns a verifier for policy; now is the time certificates
// are checked at (time.Now in production).
func NewTDQuoteVerifier(policy TDQuotePolicy, now func() time.Time) (*TDQuoteVerifier, error) {
	if _, ok := policy.ReferenceValues[0]; ok == policy.AnyMRTD {
		return nil, errors.New("tdx policy: set the MRTD reference value (index 0), or, only to capture reference values, accept any MRTD")
	}
	for index, m := range policy.ReferenceValues {
		if index > 4 {
			return nil, fmt.Errorf("tdx policy: reference value index %d: use 0 (MRTD) or 1-4 (RTMR0-3)", index)
		}
		if len(m.Expected) != MeasurementSize {
			return nil, fmt.Errorf("tdx policy: reference value index %d has %d bytes, want %d", index, len(m.Expected), MeasurementSize)
		}
	}
	for _, f := range []struct {
		name  string
		value []byte
		size  int
	}{
		{"minimum TEE_TCB_SVN", policy.MinimumTeeTcbSvn, 16}, {"MRSEAM", policy.MrSeam, MeasurementSize},
		{"MRSIGNERSEAM", policy.MrSignerSeam, MeasurementSize}, {"TD_ATTRIBUTES", policy.TdAttributes, 8},
		{"XFAM", policy.Xfam, 8}, {"QE vendor ID", policy.QeVendorID, 16},
	} {
		if f.value != nil && len(f.value) != f.size {
			return nil, fmt.Errorf("tdx policy: %s has %d bytes, want %d", f.name, len(f.value), f.size)
		}
	}
	if len(policy.TdAttributes) == 8 && policy.TdAttributes[0]&tdAttributesDebug != 0 {
		return nil, errors.New("tdx policy: TD_ATTRIBUTES may not have DEBUG set: a debuggable TD's memory is readable by the host")
	}
	if policy.CheckRevocations && policy.Collateral == nil {
		return nil, errors.New("tdx policy: checking revocations needs a collateral source (Intel PCS through a cache)")
	}
	return &TDQuoteVerifier{policy: policy, now: now}, nil
}

// Variant returns attestation.VariantTDX.
func (v *TDQuoteVerifier) Variant() attestation.Variant { return attestation.VariantTDX }

// Verify checks evidence (a marshalled TDXEvidence): the quote's signature
// under the attestation key, the QE report under the PCK certificate and its
// chain to the trusted root; REPORTDATA = SHA-512(nonce || user data); the TD
// is not debuggable; TEE_TCB_SVN at or above the minimum; and MRTD and RTMRs
// against the reference values.
func (v *TDQuoteVerifier) Verify(ctx context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	ev := &attestationv1.TDXEvidence{}
	if err := attestation.DecodeEvidence(evidence, ev); err != nil {
		return nil, err
	}
	parsed, err := quoteToProto(ev.GetQuote())
	if err != nil {
		return nil, fmt.Errorf("%w: decoding TDX quote: %w", attestation.ErrMalformed, err)
	}
	quote, ok := parsed.(*pb.QuoteV4)
	if !ok {
		return nil, fmt.Errorf("%w: TDX quote is %T, want version 4", attestation.ErrMalformed, parsed)
	}
	now := v.now()
	if err := verify.TdxQuoteContext(ctx, quote, &verify.Options{
		TrustedRoots:     v.policy.TrustedRoots,
		GetCollateral:    v.policy.Collateral != nil,
		Getter:           v.policy.Collateral,
		CheckRevocations: v.policy.CheckRevocations,
		Now:              &verify.TimeSet{PckCertChain: now, TcbInfo: now, QeIdentity: now, PckCrl: now, RootCaCrl: now},
	}); err != nil {
		return nil, fmt.Errorf("%w: TDX quote signature or PCK chain: %w", attestation.ErrSignature, err)
	}
	body := quote.GetTdQuoteBody()
	if subtle.ConstantTimeCompare(body.GetReportData(), attestation.Binding512(nonce, ev.GetUserData())) != 1 {
		return nil, fmt.Errorf("%w: REPORTDATA is not SHA-512(nonce || user data)", attestation.ErrNonce)
	}
	if attrs := body.GetTdAttributes(); len(attrs) == 0 || attrs[0]&tdAttributesDebug != 0 {
		return nil, fmt.Errorf("%w: TD is debuggable (TD_ATTRIBUTES.DEBUG set)", attestation.ErrPolicy)
	}
	if err := validate.TdxQuote(quote, &validate.Options{
		HeaderOptions: validate.HeaderOptions{
			MinimumQeSvn: v.policy.MinimumQeSvn, MinimumPceSvn: v.policy.MinimumPceSvn, QeVendorID: v.policy.QeVendorID,
		},
		TdQuoteBodyOptions: validate.TdQuoteBodyOptions{
			MinimumTeeTcbSvn: v.policy.MinimumTeeTcbSvn, MrSeam: v.policy.MrSeam,
			TdAttributes: v.policy.TdAttributes, Xfam: v.policy.Xfam,
		},
	}); err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrPolicy, err)
	}
	if v.policy.MrSignerSeam != nil && !bytes.Equal(body.GetMrSignerSeam(), v.policy.MrSignerSeam) {
		return nil, fmt.Errorf("%w: MRSIGNERSEAM %x is not the policy's %x", attestation.ErrPolicy, body.GetMrSignerSeam(), v.policy.MrSignerSeam)
	}
	got := map[uint32][]byte{0: body.GetMrTd()}
	for i, rtmr := range body.GetRtmrs() {
		got[uint32(i+1)] = rtmr
	}
	warnings, err := v.policy.ReferenceValues.Compare(got)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrMeasurement, err)
	}
	identity, err := platformIdentity(quote)
	if err != nil {
		return nil, err
	}
	result := &attestation.Result{
		Variant:      attestation.VariantTDX,
		UserData:     ev.GetUserData(),
		Identity:     identity,
		Measurements: got,
		Endorsement:  fmt.Sprintf("tdx %s mrtd=%x teeTcbSvn=%x", identity, body.GetMrTd(), body.GetTeeTcbSvn()),
	}
	for _, w := range warnings {
		result.Warnings = append(result.Warnings, w.String())
	}
	return result, nil
}

// platformIdentity names the platform by the PPID (platform provisioning
// ID) in its verified PCK certificate.
func platformIdentity(quote *pb.QuoteV4) (string, error) {
	chain, err := verify.ExtractChainFromQuote(quote)
	if err != nil {
		return "", fmt.Errorf("%w: PCK chain: %w", attestation.ErrMalformed, err)
	}
	ext, err := pcs.PckCertificateExtensions(chain.PCKCertificate)
	if err != nil {
		return "", fmt.Errorf("%w: PCK certificate extensions: %w", attestation.ErrMalformed, err)
	}
	return attestation.PrefixTDXPPID + ext.PPID, nil
}

// Evidence assembles TDXEvidence from a raw quote, as an attester does.
func Evidence(quote, userData []byte) ([]byte, error) {
	return proto.Marshal(&attestationv1.TDXEvidence{Quote: bytes.Clone(quote), UserData: userData})
}

// quoteToProto is abi.QuoteToProto, which panics on some malformed quotes
// (go-tdx-guest v0.3.2's qeAuthDataToProto slices by a length field it does
// not bound; found by FuzzVerify, testdata/fuzz): the panic becomes an error,
// so a peer's bytes cannot crash the verifier.
func quoteToProto(raw []byte) (parsed any, err error) {
	defer func() {
		if r := recover(); r != nil {
			parsed, err = nil, fmt.Errorf("the quote's lengths are inconsistent: %v", r)
		}
	}()
	return abi.QuoteToProto(raw)
}
