package attestation

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/gatehouse-dev/gatehouse/internal/protostrict"
)

// NonceSize is the size of a nonce in bytes. Nonces are random and chosen by
// the relying party; a verifier refuses any other size.
const NonceSize = 32

// MaxEvidenceSize bounds evidence in bytes, so a peer cannot make a verifier
// parse or allocate without limit. The largest evidence is a TPM quote with an
// event log; 128 KiB leaves room for a long firmware event log and stays well
// inside crypto/tls's 256 KiB limit on a Certificate message, which has to
// carry it in attested TLS.
const MaxEvidenceSize = 128 << 10

// Attester produces evidence about the platform it runs on (RFC 9334 §3.1).
type Attester interface {
	// Variant returns the attestation variant of the evidence.
	Variant() Variant
	// Attest returns evidence bound to userData and nonce (NonceSize bytes).
	Attest(ctx context.Context, userData, nonce []byte) ([]byte, error)
}

// Verifier appraises evidence (RFC 9334 §3.2).
type Verifier interface {
	// Variant returns the attestation variant the verifier accepts.
	Variant() Variant
	// Verify checks evidence against nonce, the verifier's endorsements and
	// its reference values. On success it returns what the evidence proves;
	// on failure an error wrapping one of the Err* values of this package.
	Verify(ctx context.Context, evidence, nonce []byte) (*Result, error)
}

// KeyActivation is a proof of key residency that evidence asks for and
// the verifier has not seen yet: the evidence names its signing key (a TPM
// AK) together with an endorsed key (the TPM's EK, certified by its
// manufacturer), and only the attester holding both can answer a
// challenge made for the pair (TPM 2.0 credential activation, Part 1 §24).
// A relying party acts on a Result carrying one only after it sent
// Challenge's challenge over the channel the evidence is bound to and the
// answer equalled the secret; attested TLS does this inside its handshake
// (package atls, docs/attestation.md "Endorsed keys").
type KeyActivation interface {
	// Challenge returns a fresh challenge for the attester (at most
	// MaxActivationSize bytes) and the secret a correct answer equals.
	Challenge() (challenge, secret []byte, err error)
}

// Activator is an attester whose evidence asks for a KeyActivation: its
// verifier sends a challenge over the channel the evidence is bound to,
// and Activate answers it.
type Activator interface {
	Attester
	// RequestsActivation reports whether this attester's evidence asks for
	// an activation challenge (it carries an endorsed key to activate
	// against). The verifier's Result then carries a KeyActivation.
	RequestsActivation() bool
	// Activate answers challenge, returning its secret, or an error when
	// this attester cannot (its keys are not the pair the challenge was
	// made for).
	Activate(ctx context.Context, challenge []byte) ([]byte, error)
}

// MaxActivationSize bounds an activation challenge or answer in bytes.
const MaxActivationSize = 4 << 10

// Result is what verified evidence proves.
type Result struct {
	// Variant that produced the evidence.
	Variant Variant
	// UserData the evidence is bound to.
	UserData []byte
	// Identity names the attesting key, stable across reboots: for every
	// variant the (v)TPM's AK, "tpm-ak:sha256:<hex of the AK's
	// SubjectPublicKeyInfo digest>". A hardware report's own result
	// (Hardware) names the host instead: "sev-snp-chip:<hex CHIP_ID>",
	// "tdx-ppid:<hex PPID of the PCK certificate>", or "" when the report
	// names no host (see package snp). Node bindings and audit logs use
	// it; deny lists match every identity of Identities.
	Identity string
	// EKCertificate names the TPM endorsement key certificate that
	// endorsed the AK: set only when the verifier trusts keys through EK
	// certificates (a policy's ekRoots) and this one chained to them; nil
	// otherwise (an EK certificate sent to another policy is activated
	// against but not trusted, so it proves no identity).
	EKCertificate *CertificateName
	// GCEInstance is the Compute Engine instance named by the AK
	// certificate that Google's vTPM CA issued (a policy's gce); nil
	// otherwise.
	GCEInstance *GCEInstance
	// Measurements are the verified measurements by index (see package
	// measurements for what an index means per variant).
	Measurements map[uint32][]byte
	// BootEvents are the events of the TCG event log the evidence carried
	// (variant tpm and the confidential VMs' vTPM quotes), in log order,
	// for the quoted PCRs the log replays to; nil when it carried none.
	// Shared between results: read only.
	BootEvents []BootEvent
	// Warnings lists mismatches of warn-only reference values.
	Warnings []string
	// AppraisalPolicy names the version of the appraisal policy that
	// accepted the evidence (RFC 9334 §8.5, "Appraisal Policy for
	// Evidence"), when the verifier has versions; "" otherwise. A relying
	// party holding a result from an earlier handshake compares it with the
	// policy in force to know whether it must appraise the evidence again.
	AppraisalPolicy string
	// Endorsement says how the attesting key is trusted, for audit logs:
	// "pinned", "ak-certificate" or "ek-certificate" (then followed by the
	// EK certificate's TPM manufacturer, model, issuer and serial number).
	// For sev-snp and tdx it names the hardware that bound the vTPM key and
	// what it measured.
	Endorsement string
	// Hardware is, for the confidential VM variants (sev-snp, tdx), the
	// result of the hardware report: its Measurements are the launch
	// measurement (sev-snp index 0) or MRTD and RTMR0-3 (tdx 0-4), its
	// Identity the chip or platform (shared by every VM on that host).
	// Nil for tpm.
	Hardware *Result
	// Activation, when set, is the key activation the evidence asks for:
	// the result holds only once the attester answered it (see
	// KeyActivation). Attested TLS completes it before a connection is
	// used; it is nil in a result a connection hands out.
	Activation KeyActivation
}

// BootEvent is one event of a TCG event log (TCG PC Client Platform
// Firmware Profile §10.2.2, TCG_PCR_EVENT2) whose digest a replay matched to
// a quoted PCR value. The quote vouches for Digest only: Type and
// Description are what the log says about it.
type BootEvent struct {
	// Number is the event's position in the log, the Spec ID event being
	// 0 (as tpm2_eventlog numbers them).
	Number uint32
	// PCR is the PCR the event extended.
	PCR uint32
	// Type is the TCG event type's name, e.g. "EV_IPL" (Firmware Profile
	// §10.4.1), or "EV_UNKNOWN_0x…" for a type the spec does not name.
	Type string
	// Description says what was measured, decoded from the event data
	// (a UKI section such as ".cmdline", an EFI variable such as
	// "SecureBoot", an image's device path); "" when the data says
	// nothing readable. At most 160 characters, printable only.
	Description string
	// Digest is the SHA-256 digest extended into PCR (32 bytes).
	Digest []byte
}

// Errors a verifier wraps, so callers and tests can tell failures apart with
// errors.Is. Their messages never contain secrets.
var (
	// ErrMalformed: the evidence does not parse, or exceeds MaxEvidenceSize.
	ErrMalformed = errors.New("malformed evidence")
	// ErrNonce: the evidence is not bound to the expected nonce (replayed or stale).
	ErrNonce = errors.New("evidence is not bound to the expected nonce")
	// ErrSignature: the evidence's signature does not verify.
	ErrSignature = errors.New("evidence signature is invalid")
	// ErrUntrustedKey: the key that signed the evidence is not endorsed.
	ErrUntrustedKey = errors.New("evidence is signed by an untrusted key")
	// ErrPolicy: the evidence verifies but violates the appraisal policy
	// (PCR selection, hash algorithm, debug mode, TCB version, ...).
	ErrPolicy = errors.New("evidence violates the appraisal policy")
	// ErrMeasurement: a measurement differs from its enforced reference value.
	ErrMeasurement = errors.New("measurements do not match the reference values")
	// ErrActivation: the attester did not answer the key activation its
	// evidence asked for (see KeyActivation): its attesting key is not
	// resident with the endorsed key, or the answer was replayed.
	ErrActivation = errors.New("key activation failed")
)

// Variant names an attestation variant.
type Variant string

// The variants Gatehouse knows.
const (
	VariantTPM Variant = "tpm"
	VariantSNP Variant = "sev-snp"
	VariantTDX Variant = "tdx"
	// VariantAzureSNP is an Azure confidential VM on AMD SEV-SNP whose
	// vTPM runs in Microsoft's paravisor (package azurecvm).
	VariantAzureSNP Variant = "azure-sev-snp"
)

// oidArc is Gatehouse's private, unregistered OID arc for evidence
// extensions, in the style of Constellation's 1.3.9900 and Contrast's 1.3.9901
// (docs/attestation.md explains the choice and the plan to move to the TCG
// OID 2.23.133.5.4.9). Variants are numbered below it; numbers are never
// reused.
var oidArc = asn1.ObjectIdentifier{1, 3, 9903, 1}

// variantNumbers assigns each variant its arc number. Stable: append only.
var variantNumbers = map[Variant]int{
	VariantTPM:      1,
	VariantSNP:      2,
	VariantTDX:      3,
	VariantAzureSNP: 4,
}

// OID returns the object identifier of v's evidence extension, or an error
// listing the known variants.
func (v Variant) OID() (asn1.ObjectIdentifier, error) {
	n, ok := variantNumbers[v]
	if !ok {
		return nil, fmt.Errorf("unknown attestation variant %q: known variants are %s", v, knownVariants())
	}
	return append(slices.Clone(oidArc), n), nil
}

// VariantForOID returns the variant whose evidence extension has oid.
func VariantForOID(oid asn1.ObjectIdentifier) (Variant, bool) {
	for v, n := range variantNumbers {
		if len(oid) == len(oidArc)+1 && oid[:len(oidArc)].Equal(oidArc) && oid[len(oidArc)] == n {
			return v, true
		}
	}
	return "", false
}

// InArc reports whether oid lies under Gatehouse's evidence OID arc, whether
// or not it names a known variant.
func InArc(oid asn1.ObjectIdentifier) bool {
	return len(oid) > len(oidArc) && oid[:len(oidArc)].Equal(oidArc)
}

// ParseVariant returns the variant named s, or an error listing the known ones.
func ParseVariant(s string) (Variant, error) {
	v := Variant(s)
	if _, ok := variantNumbers[v]; !ok {
		return "", fmt.Errorf("unknown attestation variant %q: known variants are %s", s, knownVariants())
	}
	return v, nil
}

func knownVariants() string {
	names := make([]string, 0, len(variantNumbers))
	for v := range variantNumbers {
		names = append(names, string(v))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// DecodeEvidence unmarshals protobuf evidence into m, refusing more than
// MaxEvidenceSize bytes and fields m's schema does not define (nothing the
// verifier cannot interpret rides along). Errors wrap ErrMalformed.
func DecodeEvidence(evidence []byte, m proto.Message) error {
	if len(evidence) > MaxEvidenceSize {
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrMalformed, len(evidence), MaxEvidenceSize)
	}
	if err := proto.Unmarshal(evidence, m); err != nil {
		return fmt.Errorf("%w: decoding %s: %w", ErrMalformed, m.ProtoReflect().Descriptor().Name(), err)
	}
	if err := protostrict.CheckUnknown(m); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// CheckNonce returns an error wrapping ErrNonce unless nonce has NonceSize bytes.
func CheckNonce(nonce []byte) error {
	if len(nonce) != NonceSize {
		return fmt.Errorf("%w: nonce has %d bytes, want %d", ErrNonce, len(nonce), NonceSize)
	}
	return nil
}

// Binding256 is the 32-byte value a TPM quote's extraData carries:
// SHA-256(nonce || userData). The nonce has a fixed size, so the
// concatenation is unambiguous.
func Binding256(nonce, userData []byte) []byte {
	h := sha256.New()
	h.Write(nonce)
	h.Write(userData)
	return h.Sum(nil)
}

// Binding512 is the 64-byte value SEV-SNP REPORT_DATA and TDX REPORTDATA
// carry: SHA-512(nonce || userData).
func Binding512(nonce, userData []byte) []byte {
	h := sha512.New()
	h.Write(nonce)
	h.Write(userData)
	return h.Sum(nil)
}
