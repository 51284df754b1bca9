// Package cvm is the "sev-snp" and "tdx" variants: evidence from a
// confidential VM, made of a quote from the VM's vTPM and the hardware's
// report (an AMD SEV-SNP attestation report or an Intel TDX quote) whose
// user data is the vTPM attestation key (AK). The hardware vouches for the
// VM's launch (measurement, TCB, debug off) and for the AK; the AK vouches
// for the quote (PCRs, the node lock in PCR 15); both are bound to the
// relying party's nonce. The AK is the VM's identity: the hardware's (CHIP_ID,
// PPID) names a host that many VMs share (docs/attestation.md,
// "Confidential VMs").
//
// As Constellation's cloud SEV-SNP variants and the SVSM vTPM do, the vTPM
// must run inside the VM's trust boundary (a paravisor or SVSM at a more
// privileged VMPL, or the cloud's vTPM of a confidential VM), so that only
// the VM can use the AK the hardware report binds.
package cvm

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// CompositeVerifier verifies "sev-snp" or "tdx" evidence (a marshalled
// ConfidentialVMEvidence). Safe for concurrent use.
type CompositeVerifier struct {
	variant  attestation.Variant
	hardware attestation.Verifier
	vtpm     *tpm.QuoteVerifier
}

// NewCompositeVerifier returns a verifier of variant (attestation.VariantSNP or
// VariantTDX) checking the hardware report with hardware (an snp.ReportVerifier
// or tdx.TDQuoteVerifier, with its reference values and TCB minimums) and the
// vTPM quote with vtpm, a verifier from tpm.NewBoundVerifier (PCRs and
// their reference values).
func NewCompositeVerifier(variant attestation.Variant, hardware attestation.Verifier, vtpm *tpm.QuoteVerifier) (*CompositeVerifier, error) {
	if variant != attestation.VariantSNP && variant != attestation.VariantTDX {
		return nil, fmt.Errorf("confidential VM variant %q: want %s or %s", variant, attestation.VariantSNP, attestation.VariantTDX)
	}
	if hardware == nil || hardware.Variant() != variant || vtpm == nil {
		return nil, fmt.Errorf("confidential VM variant %s needs a %s hardware verifier and a vTPM verifier", variant, variant)
	}
	return &CompositeVerifier{variant: variant, hardware: hardware, vtpm: vtpm}, nil
}

// Variant returns the verifier's variant.
func (v *CompositeVerifier) Variant() attestation.Variant { return v.variant }

// Verify checks, in order: the hardware report (signature and chain to
// the vendor's roots, its REPORT_DATA = SHA-512(nonce || AK), debug off, TCB
// minimums, launch measurement / MRTD); then the vTPM quote, whose AK must
// be the one the report binds (the quote's extraData = SHA-256(nonce ||
// user data), PCR reference values). The result is the quote's: Identity
// the AK ("tpm-ak:sha256:…"), Measurements the PCRs; Hardware holds the
// report's result and Endorsement names the hardware and its measurement.
// Errors wrap the attestation.Err* values of the check that failed.
func (v *CompositeVerifier) Verify(ctx context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	ev := &attestationv1.ConfidentialVMEvidence{}
	if err := attestation.DecodeEvidence(evidence, ev); err != nil {
		return nil, err
	}
	if len(ev.GetVtpm()) == 0 || len(ev.GetHardware()) == 0 {
		return nil, fmt.Errorf("%w: confidential VM evidence lacks the vTPM quote or the hardware report", attestation.ErrMalformed)
	}
	hardware, err := v.hardware.Verify(ctx, ev.GetHardware(), nonce)
	if err != nil {
		return nil, fmt.Errorf("%s report: %w", v.variant, err)
	}
	result, err := v.vtpm.VerifyBound(ctx, ev.GetVtpm(), nonce, hardware.UserData)
	if err != nil {
		return nil, fmt.Errorf("vTPM quote: %w", err)
	}
	result.Variant = v.variant
	result.Endorsement = hardware.Endorsement
	result.Hardware = hardware
	result.Warnings = append(result.Warnings, hardware.Warnings...)
	return result, nil
}

// CompositeAttester produces "sev-snp" or "tdx" evidence from the VM's vTPM and
// its hardware attester (snpguest, tdxguest).
type CompositeAttester struct {
	hardware attestation.Attester
	vtpm     attestation.Attester
}

// NewCompositeAttester returns an attester combining hardware (of variant sev-snp
// or tdx) and vtpm (a tpmattester.QuoteAttester for the VM's vTPM, sending no
// EK certificate).
func NewCompositeAttester(hardware, vtpm attestation.Attester) (*CompositeAttester, error) {
	if v := hardware.Variant(); v != attestation.VariantSNP && v != attestation.VariantTDX {
		return nil, fmt.Errorf("confidential VM attester: hardware variant %q, want %s or %s", v, attestation.VariantSNP, attestation.VariantTDX)
	}
	if vtpm.Variant() != attestation.VariantTPM {
		return nil, fmt.Errorf("confidential VM attester: the vTPM attester is %q, want %s", vtpm.Variant(), attestation.VariantTPM)
	}
	return &CompositeAttester{hardware: hardware, vtpm: vtpm}, nil
}

// Variant returns the hardware's variant.
func (a *CompositeAttester) Variant() attestation.Variant { return a.hardware.Variant() }

// Attest quotes the vTPM bound to userData and nonce, then asks the
// hardware for a report bound to the quote's AK and nonce.
func (a *CompositeAttester) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	quote, err := a.vtpm.Attest(ctx, userData, nonce)
	if err != nil {
		return nil, fmt.Errorf("quoting the vTPM: %w", err)
	}
	parsed, err := tpm.ParseEvidence(quote)
	if err != nil {
		return nil, fmt.Errorf("reading the vTPM quote: %w", err)
	}
	report, err := a.hardware.Attest(ctx, parsed.GetAttestationKey(), nonce)
	if err != nil {
		return nil, fmt.Errorf("requesting the %s report: %w", a.hardware.Variant(), err)
	}
	return proto.Marshal(&attestationv1.ConfidentialVMEvidence{Vtpm: quote, Hardware: report})
}
