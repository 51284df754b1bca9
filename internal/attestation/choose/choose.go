// Package choose is the registry of attestation variants (docs/attestation.md,
// "Variants"): for each variant name the policy and the CLI use ("tpm",
// "sev-snp", "tdx"), the attester a node runs and the verifier an appraisal
// policy compiles to, side by side, as Constellation's
// internal/attestation/choose does. A new variant is one file here (its
// attester and verifier constructors, and its policy section if it has one)
// and one line in variants.
package choose

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/google/go-tpm/tpmutil"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/cvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

// variant is what the registry knows of one attestation variant.
type variant struct {
	// hardwareAttester opens the attester of the node's hardware report,
	// which binds the (v)TPM's key; nil when the TPM quote alone is the
	// evidence.
	hardwareAttester func(AttesterOptions) (attestation.Attester, error)
	// wrap turns the (v)TPM's quote attester into the variant's attester
	// when the evidence is not the quote and a hardware attester's report
	// (azure-sev-snp: the paravisor's HCL report, read through the vTPM).
	wrap func(AttesterOptions, *tpmattester.QuoteAttester) (attestation.Attester, error)
	// akSource, when set, picks the variant's AK from --attestation-key.
	akSource func(string) (tpmattester.AKSource, error)
	// verifier compiles the variant's verifier.
	verifier func(Appraisal) (attestation.Verifier, error)
}

// variants is the registry: one line per variant.
var variants = map[attestation.Variant]variant{
	attestation.VariantTPM:      {verifier: tpmVerifier},
	attestation.VariantSNP:      {hardwareAttester: snpAttester, verifier: snpVerifier},
	attestation.VariantTDX:      {hardwareAttester: tdxAttester, verifier: tdxVerifier},
	attestation.VariantAzureSNP: {wrap: azureSNPAttester, akSource: azureAKSource, verifier: azureSNPVerifier},
}

func lookup(v attestation.Variant) (variant, error) {
	entry, ok := variants[v]
	if !ok {
		return variant{}, fmt.Errorf("attestation variant %q has no attester and verifier", v)
	}
	return entry, nil
}

// Appraisal is what a variant's verifier is compiled from: an appraisal
// policy's fields, parsed (package policy reads the file form).
type Appraisal struct {
	// PCRs is the SHA-256 PCR selection every (v)TPM quote must cover.
	PCRs []int
	// ReferenceValues are the PCR values every node must show; nil when
	// capturing.
	ReferenceValues measurements.M
	// Endorsement is the policy's trust in TPM keys (variant tpm);
	// EndorsementErr says why it could not be parsed (none or two ways
	// set), EndorsementSet whether any key trust field was set.
	Endorsement    tpm.Endorsement
	EndorsementErr error
	EndorsementSet bool
	// SEVSNP and TDX are the hardware sections (variants sev-snp and tdx).
	SEVSNP *SEVSNPPolicy
	TDX    *TDXPolicy
	// Capture compiles a verifier for capturing reference values from a
	// golden node: no hardware section is needed, and any launch
	// measurement or MRTD is accepted. Never for admitting a node.
	Capture bool
	// Now is the clock certificates and collateral are checked at.
	Now func() time.Time
	// RequireEventLog refuses (v)TPM evidence without the node's TCG event
	// log (tpm.QuotePolicy.RequireEventLog).
	RequireEventLog bool
}

// Verifier compiles the verifier of variant v from a. Errors name the
// policy field that is wrong.
func Verifier(v attestation.Variant, a Appraisal) (attestation.Verifier, error) {
	entry, err := lookup(v)
	if err != nil {
		return nil, err
	}
	return entry.verifier(a)
}

// confidentialVMVerifier compiles a confidential VM variant's verifier:
// the hardware report's, and the vTPM quote's whose key the report binds,
// with a's PCR selection and reference values.
func confidentialVMVerifier(v attestation.Variant, a Appraisal, hardware func() (attestation.Verifier, error)) (attestation.Verifier, error) {
	vtpm, err := boundVTPM(v, a)
	if err != nil {
		return nil, err
	}
	hw, err := hardware()
	if err != nil {
		return nil, err
	}
	return cvm.NewCompositeVerifier(v, hw, vtpm)
}

// boundVTPM is the verifier of a confidential VM variant's vTPM quote,
// with a's PCR selection and reference values, trusting only the key its
// hardware report binds; a policy with a key trust field is refused.
func boundVTPM(v attestation.Variant, a Appraisal) (*tpm.QuoteVerifier, error) {
	if a.EndorsementSet {
		return nil, fmt.Errorf("variant %s trusts the vTPM key its hardware report binds: remove pinnedAKs, akRoots, ekRoots, ekIntermediates, gce, azureTrustedLaunch and awsNitroTPM", v)
	}
	return tpm.NewBoundVerifier(tpm.QuotePolicy{PCRs: a.PCRs, ReferenceValues: a.ReferenceValues, RequireEventLog: a.RequireEventLog}, a.Now)
}

// AttesterOptions shape a node's attester. They are the bootstrapper's
// flags, and errors name those flags.
type AttesterOptions struct {
	// TPMPath is the (v)TPM: a character device or a swtpm Unix socket.
	TPMPath string
	// PCRs are the PCRs quoted.
	PCRs []int
	// Variant is the attestation variant (--attestation).
	Variant string
	// EKCertificate says whether evidence carries the EK certificate
	// (--ek-certificate, tpmattester.ParseEKCertificateMode).
	EKCertificate string
	// AttestationKey is where the AK comes from (--attestation-key,
	// tpmattester.AKSource); "" is the variant's default (owner; azure for
	// azure-sev-snp).
	AttestationKey string
	// AzureTHIMURL is where variant azure-sev-snp fetches the chip's VCEK
	// (--azure-thim-url; "" is azurecvm.DefaultTHIMURL).
	AzureTHIMURL string
	// SNPInterface is how the SEV-SNP report is fetched
	// (--sev-snp-interface, snpguest.ParseInterface).
	SNPInterface string
	// TCGEventLog is the file of the firmware's TCG event log, sent with
	// every evidence (--tcg-event-log, default
	// tpm.DefaultTCGEventLogPath); none when "" or when the file does not
	// exist.
	TCGEventLog string
}

// NodeAttester is a node's open (v)TPM and its attesters.
type NodeAttester struct {
	// TPM is the open (v)TPM (the node lock extends a PCR of it).
	TPM io.ReadWriteCloser
	// TPMAttester quotes with the (v)TPM's attestation key.
	TPMAttester *tpmattester.QuoteAttester
	// Attester produces the node's evidence: the TPM quote, or for a
	// confidential VM variant the vTPM quote and the hardware report
	// binding its key.
	Attester attestation.Attester
	// TCGEventLog is the file of the TCG event log that evidence carries;
	// "" when it carries none (for the start-up log).
	TCGEventLog string
}

// Close closes the attester and the TPM.
func (n *NodeAttester) Close() {
	_ = n.TPMAttester.Close()
	_ = n.TPM.Close()
}

// OpenAttester opens the (v)TPM at o.TPMPath and the attester of
// o.Variant: quotes of o.PCRs with the AK from o.AttestationKey, sending
// the EK certificate per o.EKCertificate; for a confidential VM variant
// the hardware report binding that AK is added, and no EK certificate is
// sent (the report vouches for the key). Errors name the flag that is
// wrong; nothing stays open after an error.
func OpenAttester(o AttesterOptions) (*NodeAttester, error) {
	v, err := attestation.ParseVariant(o.Variant)
	if err != nil {
		return nil, fmt.Errorf("--attestation: %w", err)
	}
	entry, err := lookup(v)
	if err != nil {
		return nil, fmt.Errorf("--attestation: %w", err)
	}
	mode, err := tpmattester.ParseEKCertificateMode(o.EKCertificate)
	if err != nil {
		return nil, fmt.Errorf("--ek-certificate: %w", err)
	}
	akSource := tpmattester.AKSource(o.AttestationKey)
	if entry.akSource != nil {
		if akSource, err = entry.akSource(o.AttestationKey); err != nil {
			return nil, fmt.Errorf("--attestation-key %s: %w", o.AttestationKey, err)
		}
	}
	var hardware attestation.Attester
	if entry.hardwareAttester != nil {
		if hardware, err = entry.hardwareAttester(o); err != nil {
			return nil, err
		}
	}
	if entry.hardwareAttester != nil || entry.wrap != nil {
		// The hardware report vouches for the vTPM's key: no EK to activate.
		mode = tpmattester.EKCertificateOff
	}
	tcgLog, err := tcgEventLogPath(o.TCGEventLog)
	if err != nil {
		return nil, err
	}
	rw, err := tpmutil.OpenTPM(o.TPMPath)
	if err != nil {
		return nil, fmt.Errorf("opening the TPM %s: %w", o.TPMPath, err)
	}
	tpmAttester, err := tpmattester.New(rw, tpmattester.Options{PCRs: o.PCRs, EKCertificate: mode,
		AttestationKey: akSource, TCGEventLogPath: tcgLog})
	if err != nil {
		_ = rw.Close()
		return nil, fmt.Errorf("creating the attestation key: %w", err)
	}
	n := &NodeAttester{TPM: rw, TPMAttester: tpmAttester, Attester: tpmAttester, TCGEventLog: tcgLog}
	switch {
	case entry.wrap != nil:
		n.Attester, err = entry.wrap(o, tpmAttester)
	case hardware != nil:
		n.Attester, err = cvm.NewCompositeAttester(hardware, tpmAttester)
	}
	if err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// tcgEventLogPath returns path when it names a readable file, "" when it is
// "" or does not exist (a machine whose firmware keeps no log, or a local
// cluster's node whose TPM is a swtpm), and an error naming the flag
// otherwise.
func tcgEventLogPath(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("--tcg-event-log: %w", err)
	}
	return path, f.Close()
}
