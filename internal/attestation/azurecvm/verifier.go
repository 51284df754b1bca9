// Package azurecvm is the "azure-sev-snp" variant: an Azure confidential
// VM on AMD SEV-SNP, whose vTPM runs in Microsoft's paravisor (HCL) at
// VMPL 0 rather than in the guest's own firmware (docs/attestation.md,
// "Azure confidential VMs"). Its evidence (AzureCVMEvidence) is the vTPM
// quote and the paravisor's HCL report: an SEV-SNP report whose
// REPORT_DATA[0:32] is SHA-256 of the report's runtime data, a JSON
// document naming the vTPM attestation key (AK) and the user data the
// guest asked the report for. The chip vouches for the paravisor and,
// through the runtime data, for the AK; the AK vouches for the quote
// (PCRs, the node lock in PCR 15). Both the quote's extraData and the
// report's user data carry the relying party's binding
// SHA-256(nonce || user data), so neither can be replayed.
package azurecvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// Verifier verifies "azure-sev-snp" evidence. Safe for concurrent use.
type Verifier struct {
	report *snp.ReportVerifier
	vtpm   *tpm.QuoteVerifier
}

// NewVerifier returns a verifier checking the HCL report's SEV-SNP report
// with report (the paravisor's launch measurements and TCB minimums; the
// report must come from VMPL 0, which the caller's policy should require)
// and the vTPM quote with vtpm, a verifier from tpm.NewBoundVerifier (PCRs
// and their reference values).
func NewVerifier(report *snp.ReportVerifier, vtpm *tpm.QuoteVerifier) (*Verifier, error) {
	if report == nil || vtpm == nil {
		return nil, fmt.Errorf("variant %s needs an SEV-SNP report verifier and a vTPM verifier", attestation.VariantAzureSNP)
	}
	return &Verifier{report: report, vtpm: vtpm}, nil
}

// Variant returns attestation.VariantAzureSNP.
func (v *Verifier) Variant() attestation.Variant { return attestation.VariantAzureSNP }

// Verify checks evidence (a marshalled AzureCVMEvidence) against nonce,
// with binding SHA-256(nonce || user data), the user data being the vTPM
// evidence's: see VerifyBinding for the checks. The result is the quote's
// (Identity the AK, Measurements the PCRs); Hardware holds the SEV-SNP
// report's result. Errors wrap the attestation.Err* values of the check
// that failed.
func (v *Verifier) Verify(ctx context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	ev, err := decode(evidence)
	if err != nil {
		return nil, err
	}
	quote, err := tpm.ParseEvidence(ev.GetVtpm())
	if err != nil {
		return nil, fmt.Errorf("vTPM quote: %w", err)
	}
	return v.verify(ctx, ev, attestation.Binding256(nonce, quote.GetUserData()))
}

// VerifyBinding runs Verify's checks with binding given rather than
// computed from a nonce: the form of evidence other attesters record
// (Azure's samples and trustee put the relying party's report data there
// directly), so recorded real evidence runs through the same checks.
// Gatehouse's relying parties use Verify. The checks, in order:
//   - the HCL report parses and holds an SEV-SNP report;
//   - the SEV-SNP report's signature by the VCEK the evidence carries,
//     its chain to AMD's roots, debug off, TCB minimums, VMPL and the
//     paravisor's launch measurement (snp.ReportVerifier.VerifyReport),
//     with REPORT_DATA = SHA-256(runtime data) followed by 32 zero bytes;
//   - the runtime data's user-data is binding followed by zeros;
//   - the vTPM quote is signed by the runtime data's HCLAkPub key, its
//     extraData is binding, its PCRs match the reference values.
func (v *Verifier) VerifyBinding(ctx context.Context, evidence, binding []byte) (*attestation.Result, error) {
	ev, err := decode(evidence)
	if err != nil {
		return nil, err
	}
	return v.verify(ctx, ev, binding)
}

func decode(evidence []byte) (*attestationv1.AzureCVMEvidence, error) {
	ev := &attestationv1.AzureCVMEvidence{}
	if err := attestation.DecodeEvidence(evidence, ev); err != nil {
		return nil, err
	}
	if len(ev.GetVtpm()) == 0 || len(ev.GetHclReport()) == 0 {
		return nil, fmt.Errorf("%w: %s evidence lacks the vTPM quote or the HCL report", attestation.ErrMalformed, attestation.VariantAzureSNP)
	}
	return ev, nil
}

func (v *Verifier) verify(ctx context.Context, ev *attestationv1.AzureCVMEvidence, binding []byte) (*attestation.Result, error) {
	hcl, err := parseHCLReport(ev.GetHclReport())
	if err != nil {
		return nil, err
	}
	var certTable []byte
	if len(ev.GetVcek()) > 0 {
		certTable = abi.CertsFromProto(&spb.CertificateChain{VcekCert: ev.GetVcek()}).Marshal()
	}
	hardware, err := v.report.VerifyReport(ctx, hcl.SNPReport, certTable, reportDataOf(hcl.RuntimeData))
	if err != nil {
		return nil, fmt.Errorf("HCL report's SEV-SNP report: %w", err)
	}
	runtime, err := parseRuntimeData(hcl.RuntimeData)
	if err != nil {
		return nil, err
	}
	if err := runtime.CheckUserData(binding); err != nil {
		return nil, err
	}
	ak, err := runtime.AttestationKey()
	if err != nil {
		return nil, err
	}
	result, err := v.vtpm.VerifyBoundKey(ctx, ev.GetVtpm(), binding, ak)
	if err != nil {
		return nil, fmt.Errorf("vTPM quote: %w", err)
	}
	hardware.Variant = attestation.VariantAzureSNP
	result.Variant = attestation.VariantAzureSNP
	result.Hardware = hardware
	c := runtime.VMConfiguration
	result.Endorsement = fmt.Sprintf("azure-sev-snp vmUniqueId=%s secureBoot=%t console=%t %s",
		c.VMUniqueID, c.SecureBoot, c.ConsoleEnabled, hardware.Endorsement)
	result.Warnings = append(result.Warnings, hardware.Warnings...)
	return result, nil
}

// reportDataOf is the REPORT_DATA of an HCL report whose runtime data is
// runtimeData.
func reportDataOf(runtimeData []byte) []byte {
	sum := sha256.Sum256(runtimeData)
	return append(sum[:], bytes.Repeat([]byte{0}, abi.ReportDataSize-sha256.Size)...)
}
