// Package snp verifies "sev-snp" evidence: an AMD SEV-SNP attestation report
// (SEV Secure Nested Paging Firmware ABI Specification, rev. 1.55, §7.3 and
// table 22) signed by the chip's VCEK (or the cloud provider's VLEK), whose
// certificate chains through the ASK (or ASVK) to the AMD root key (ARK).
// Signature, chain and policy checks use github.com/google/go-sev-guest.
//
// The attester side, which reads /dev/sev-guest, is in package snpguest, so
// a verifier never links guest-device code.
package snp

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/validate"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// MeasurementSize is the size of the launch MEASUREMENT in bytes.
const MeasurementSize = 48

// ReportPolicy is the appraisal policy of a ReportVerifier.
type ReportPolicy struct {
	// LaunchMeasurements are the accepted launch MEASUREMENTs (48 bytes
	// each, at least one): one per image version a cluster runs.
	LaunchMeasurements [][]byte
	// AnyLaunchMeasurement accepts any launch measurement, with
	// LaunchMeasurements empty: only to capture reference values from a
	// golden node (policy.Policy.KeyVerifier), never to admit one.
	AnyLaunchMeasurement bool
	// MinimumTCB is the lowest acceptable REPORTED_TCB, per component.
	MinimumTCB kds.TCBParts
	// MinimumLaunchTCB is the lowest acceptable LAUNCH_TCB, per component.
	MinimumLaunchTCB kds.TCBParts
	// GuestPolicy is the most the guest policy may allow (SMT, migration
	// agent, CXL, single socket off, minimum ABI version; SNP ABI spec §4.3);
	// nil allows everything but debugging. Debugging is always refused.
	GuestPolicy *abi.SnpPolicy
	// IDKeyDigests, when set, are the SHA-384 digests of the ID keys that
	// may sign the guest's ID block (the launch digest's author, e.g. the
	// image vendor); the report must carry one of them.
	IDKeyDigests [][]byte
	// AuthorKeyDigests, when set, are the accepted digests of the key that
	// signed the ID key; the report must carry one of them.
	AuthorKeyDigests [][]byte
	// VMPL, when set, is the VM privilege level the report must come from
	// (0 for a guest without an SVSM).
	VMPL *int
	// TrustedRoots are the AMD root certificates by product line ("Milan",
	// "Genoa", "Turin"); nil means the AMD roots embedded in go-sev-guest.
	TrustedRoots map[string][]*trust.AMDRootCerts
	// Collateral, when set, fetches what the evidence lacks from AMD's Key
	// Distribution Service (a missing VCEK, the product's CRL), typically
	// through a collateral.Cache so verification works offline once cached.
	// Nil: only the certificates the evidence carries are used.
	Collateral trust.HTTPSGetter
	// CheckRevocations checks the product's CRL, signed by the ARK, through
	// Collateral: a revoked ASK/ASVK is refused, and so is a CRL that cannot
	// be had fresh.
	CheckRevocations bool
}

// ReportVerifier verifies "sev-snp" evidence. Debug guests are always refused.
type ReportVerifier struct {
	policy ReportPolicy
	now    func() time.Time
}

// NewReportVerifier returns a verifier for policy; now is the time certificates
// are checked at (time.Now in production).
func NewReportVerifier(policy ReportPolicy, now func() time.Time) (*ReportVerifier, error) {
	if len(policy.LaunchMeasurements) == 0 && !policy.AnyLaunchMeasurement {
		return nil, errors.New("sev-snp policy: no launch measurement; name at least one")
	}
	if len(policy.LaunchMeasurements) > 0 && policy.AnyLaunchMeasurement {
		return nil, errors.New("sev-snp policy: launch measurements are named, and any is accepted; choose one")
	}
	for i, m := range policy.LaunchMeasurements {
		if len(m) != MeasurementSize {
			return nil, fmt.Errorf("sev-snp policy: launch measurement %d has %d bytes, want %d", i, len(m), MeasurementSize)
		}
	}
	if policy.GuestPolicy != nil && policy.GuestPolicy.Debug {
		return nil, errors.New("sev-snp policy: the guest policy may not allow debugging: a debuggable guest's memory is readable by the host")
	}
	for i, d := range slices.Concat(policy.IDKeyDigests, policy.AuthorKeyDigests) {
		if len(d) != abi.IDKeyDigestSize {
			return nil, fmt.Errorf("sev-snp policy: key digest %d has %d bytes, want %d (SHA-384)", i, len(d), abi.IDKeyDigestSize)
		}
	}
	if policy.CheckRevocations && policy.Collateral == nil {
		return nil, errors.New("sev-snp policy: checking revocations needs a collateral source (AMD KDS through a cache)")
	}
	return &ReportVerifier{policy: policy, now: now}, nil
}

// Variant returns attestation.VariantSNP.
func (v *ReportVerifier) Variant() attestation.Variant { return attestation.VariantSNP }

// Verify checks evidence (a marshalled SNPEvidence): the report's signature
// under the VCEK/VLEK from the certificate table and that certificate's chain
// to the trusted AMD roots; REPORT_DATA = SHA-512(nonce || user data); the
// guest policy has debugging off; TCB versions at or above the minimums; the
// VMPL; and the launch measurement against the reference value.
func (v *ReportVerifier) Verify(ctx context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	ev := &attestationv1.SNPEvidence{}
	if err := attestation.DecodeEvidence(evidence, ev); err != nil {
		return nil, err
	}
	result, err := v.VerifyReport(ctx, ev.GetReport(), ev.GetCertificateTable(), attestation.Binding512(nonce, ev.GetUserData()))
	if err != nil {
		return nil, err
	}
	result.UserData = ev.GetUserData()
	return result, nil
}

// VerifyReport runs Verify's checks on a raw report (1184 bytes, SNP ABI
// spec table 22) and certificate table (GHCB spec §4.1.8.1; empty when
// the policy's collateral source fetches the VCEK) whose REPORT_DATA must
// equal reportData (64 bytes), for a report another party's binding
// shapes: Azure's paravisor sets REPORT_DATA to SHA-256 of its HCL
// report's runtime data (package azurecvm). Errors as Verify's.
func (v *ReportVerifier) VerifyReport(ctx context.Context, rawReport, certTable, reportData []byte) (*attestation.Result, error) {
	att, err := parse(rawReport, certTable, v.policy.Collateral != nil)
	if err != nil {
		return nil, err
	}
	if err := verify.SnpAttestationContext(ctx, att, &verify.Options{
		DisableCertFetching: v.policy.Collateral == nil,
		Getter:              v.policy.Collateral,
		CheckRevocations:    v.policy.CheckRevocations,
		TrustedRoots:        v.policy.TrustedRoots,
		Now:                 v.now(),
	}); err != nil {
		return nil, fmt.Errorf("%w: SEV-SNP report signature or VCEK chain: %w", attestation.ErrSignature, err)
	}
	report := att.GetReport()
	if subtle.ConstantTimeCompare(report.GetReportData(), reportData) != 1 {
		return nil, fmt.Errorf("%w: REPORT_DATA is not the binding of this evidence (SHA-512(nonce || user data) for Gatehouse's own)", attestation.ErrNonce)
	}
	policy, err := abi.ParseSnpPolicy(report.GetPolicy())
	if err != nil {
		return nil, fmt.Errorf("%w: guest policy: %w", attestation.ErrMalformed, err)
	}
	if policy.Debug {
		return nil, fmt.Errorf("%w: guest policy allows debugging", attestation.ErrPolicy)
	}
	// Debugging is refused above; by default everything else the guest
	// policy may allow.
	guestPolicy := abi.SnpPolicy{SMT: true, MigrateMA: true, CXLAllowed: true}
	if v.policy.GuestPolicy != nil {
		guestPolicy = *v.policy.GuestPolicy
	}
	if err := validate.SnpAttestation(att, &validate.Options{
		GuestPolicy:            guestPolicy,
		MinimumTCB:             v.policy.MinimumTCB,
		MinimumLaunchTCB:       v.policy.MinimumLaunchTCB,
		VMPL:                   v.policy.VMPL,
		TrustedIDKeyHashes:     v.policy.IDKeyDigests,
		TrustedAuthorKeyHashes: v.policy.AuthorKeyDigests,
		RequireIDBlock:         len(v.policy.IDKeyDigests) > 0,
		RequireAuthorKey:       len(v.policy.AuthorKeyDigests) > 0,
	}); err != nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrPolicy, err)
	}
	if !v.policy.AnyLaunchMeasurement && !slices.ContainsFunc(v.policy.LaunchMeasurements, func(m []byte) bool { return bytes.Equal(m, report.GetMeasurement()) }) {
		return nil, fmt.Errorf("%w: launch measurement %x is none of the policy's %d", attestation.ErrMeasurement, report.GetMeasurement(), len(v.policy.LaunchMeasurements))
	}
	result := &attestation.Result{
		Variant:      attestation.VariantSNP,
		Identity:     chipIdentity(att),
		Measurements: map[uint32][]byte{0: report.GetMeasurement()},
		Endorsement: fmt.Sprintf("sev-snp chip=%x measurement=%x reportedTCB=%#x vmpl=%d",
			report.GetChipId(), report.GetMeasurement(), report.GetReportedTcb(), report.GetVmpl()),
	}
	return result, nil
}

// chipIdentity names the chip of a verified report,
// "sev-snp-chip:<hex CHIP_ID>": the report's CHIP_ID, which the chip's
// firmware writes; when the host masked it (MASK_CHIP_ID: zeros, SNP ABI
// spec §7.3), the HWID of the VCEK that signed the report, which is the
// same chip's ID (go-sev-guest checked the VCEK's signature and chain).
// It is "" when neither names a chip: a masked report signed with a VLEK,
// the cloud provider's key shared by its hosts. Without this fallback a
// host on a denied chip could mask CHIP_ID to slip past the deny list.
func chipIdentity(att *spb.Attestation) string {
	chip := att.GetReport().GetChipId()
	if slices.ContainsFunc(chip, func(b byte) bool { return b != 0 }) {
		return attestation.PrefixSNPChip + hex.EncodeToString(chip)
	}
	info, err := abi.ParseSignerInfo(att.GetReport().GetSignerInfo())
	if err != nil || info.SigningKey != abi.VcekReportSigner {
		return ""
	}
	vcek, err := x509.ParseCertificate(att.GetCertificateChain().GetVcekCert())
	if err != nil {
		return ""
	}
	exts, err := kds.VcekCertificateExtensions(vcek)
	if err != nil || !slices.ContainsFunc(exts.HWID, func(b byte) bool { return b != 0 }) {
		return ""
	}
	return attestation.PrefixSNPChip + hex.EncodeToString(exts.HWID)
}

// parse decodes the report and certificate table into go-sev-guest's form.
// Without fetch, the table must hold the VCEK or VLEK; with it, a missing
// VCEK is fetched from AMD KDS by the report's chip ID and TCB.
func parse(rawReport, certTable []byte, fetch bool) (*spb.Attestation, error) {
	if len(rawReport) != abi.ReportSize {
		return nil, fmt.Errorf("%w: report has %d bytes, want %d", attestation.ErrMalformed, len(rawReport), abi.ReportSize)
	}
	report, err := abi.ReportToProto(rawReport)
	if err != nil {
		return nil, fmt.Errorf("%w: decoding SEV-SNP report: %w", attestation.ErrMalformed, err)
	}
	table := &abi.CertTable{}
	if len(certTable) > 0 || !fetch {
		if err := checkCertTable(certTable); err != nil {
			return nil, fmt.Errorf("%w: decoding certificate table: %w", attestation.ErrMalformed, err)
		}
		if err := table.Unmarshal(certTable); err != nil {
			return nil, fmt.Errorf("%w: decoding certificate table: %w", attestation.ErrMalformed, err)
		}
	}
	chain := table.Proto()
	if len(chain.GetVcekCert()) == 0 && len(chain.GetVlekCert()) == 0 && !fetch {
		return nil, fmt.Errorf("%w: certificate table holds neither VCEK nor VLEK, and no collateral source is configured to fetch the VCEK from AMD KDS", attestation.ErrUntrustedKey)
	}
	return &spb.Attestation{Report: report, CertificateChain: chain}, nil
}

// checkCertTable checks that every entry of a certificate table lies
// within it. go-sev-guest v0.15.0's CertTable.Unmarshal adds an entry's
// offset and length in uint32, so a peer's entry whose sum wraps around
// passes its bound check and panics the slice (found by cvm.FuzzVerify,
// testdata/fuzz); the sum is checked here without overflow first.
func checkCertTable(table []byte) error {
	entries, err := abi.ParseSnpCertTableHeader(table)
	if err != nil {
		return err
	}
	for i, e := range entries {
		if uint64(e.Offset)+uint64(e.Length) > uint64(len(table)) {
			return fmt.Errorf("entry %d (offset %d, length %d) lies outside the %d-byte table", i, e.Offset, e.Length, len(table))
		}
	}
	return nil
}

// Evidence assembles SNPEvidence from a raw report and certificate table, as
// an attester does.
func Evidence(report, certTable, userData []byte) ([]byte, error) {
	if len(report) < abi.ReportSize {
		return nil, fmt.Errorf("SEV-SNP report has %d bytes, want %d", len(report), abi.ReportSize)
	}
	return proto.Marshal(&attestationv1.SNPEvidence{
		Report:           bytes.Clone(report[:abi.ReportSize]),
		CertificateTable: certTable,
		UserData:         userData,
	})
}
