// Package policy compiles an appraisal policy (reference values per node
// role, and how attestation keys are endorsed) into a verifier: the
// policy-to-verifier step every relying party shares (the join service, the
// CLI's init and verify, the local cluster). docs/joinservice.md, "Roles
// from evidence", describes the format.
package policy

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/choose"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// Policy is the file form of an appraisal policy: the join config's
// attestation.yaml and the cluster configuration's attestation section
// (docs/joinservice.md, "Join config").
type Policy struct {
	// Variant is how nodes attest: "tpm" (a TPM's quote; set one of the
	// key trust fields below), "sev-snp" or "tdx" (a confidential VM: its
	// vTPM's quote and the hardware report binding the vTPM's key; set the
	// sevSnp or tdx section, no key trust field). docs/attestation.md,
	// "Variants", has the table.
	Variant string `json:"variant"`
	// PCRs is the SHA-256 PCR selection every (v)TPM quote must cover; it
	// must include keys.NodeLockPCR.
	PCRs []int `json:"pcrs"`
	// ReferenceValues are the expected PCR values every node shares, whatever
	// its role (package measurements' format). keys.NodeLockPCR must not appear:
	// it is always enforced as zero.
	ReferenceValues json.RawMessage `json:"referenceValues,omitempty"`
	// Roles holds the reference values of each node role a node can prove
	// (RoleControlPlane, RoleWorker). A node's evidence must satisfy
	// ReferenceValues and at least one role's; the roles it satisfies are
	// the only ones it gets (docs/joinservice.md, "Roles from evidence").
	Roles map[Role]RolePolicy `json:"roles"`
	// How attestation keys (AKs) are trusted: set exactly one of AKRoots,
	// PinnedAKs, EKRoots, GCE, AzureTrustedLaunch and AWSNitroTPM (docs/attestation.md,
	// "Endorsed keys").
	//
	// AKRoots is a PEM bundle of roots for AK certificate chains.
	AKRoots string `json:"akRoots,omitempty"`
	// PinnedAKs are PEM public keys of trusted attestation keys.
	PinnedAKs []string `json:"pinnedAKs,omitempty"`
	// EKRoots is a PEM bundle of TPM manufacturers' root CAs: a node sends
	// its EK certificate, which must chain to one of them, and proves by
	// credential activation that its AK lives in the same TPM. No AK needs
	// registering beforehand.
	EKRoots string `json:"ekRoots,omitempty"`
	// EKIntermediates is a PEM bundle of the manufacturers' issuing CAs that
	// EK certificates chain through (TPMs store only the EK certificate);
	// only with EKRoots.
	EKIntermediates string `json:"ekIntermediates,omitempty"`
	// GCE trusts Compute Engine vTPMs (Shielded and Confidential VMs): the
	// AK certificate Google's vTPM CA issued the instance chains to Google's
	// roots, and names an instance in an allowed project and zone.
	GCE *GCEPolicy `json:"gce,omitempty"`
	// AzureTrustedLaunch trusts Azure Trusted Launch vTPMs: the AK
	// certificate Azure provisioned in the vTPM chains to Microsoft's vTPM
	// root, and names an admitted ID (or any VM is admitted, said so).
	AzureTrustedLaunch *AzureTrustedLaunchPolicy `json:"azureTrustedLaunch,omitempty"`
	// AWSNitroTPM trusts AWS NitroTPM vTPMs: the attestation document the
	// Nitro hypervisor signs names the AK and the quote's binding, and
	// shows the SHA-384 PCR values listed here.
	AWSNitroTPM *AWSNitroTPMPolicy `json:"awsNitroTPM,omitempty"`
	// SEVSNP is variant sev-snp's hardware section.
	SEVSNP *choose.SEVSNPPolicy `json:"sevSnp,omitempty"`
	// TDX is variant tdx's hardware section.
	TDX *choose.TDXPolicy `json:"tdx,omitempty"`
	// RequireEventLog refuses evidence whose (v)TPM quote comes without
	// the node's TCG event log (the firmware's binary_bios_measurements),
	// so that every refusal of a PCR names the event that differs. Unset,
	// it is true when any reference value lists expected events and false
	// otherwise (docs/attestation.md, "Event logs"). A log that comes is
	// replayed whatever this says.
	RequireEventLog *bool `json:"requireEventLog,omitempty"`
}

// GCEPolicy constrains the Compute Engine instances a policy trusts.
type GCEPolicy struct {
	// Projects are the allowed project IDs (at least one).
	Projects []string `json:"projects"`
	// Zones, when set, are the allowed zones, e.g. us-central1-a.
	Zones []string `json:"zones,omitempty"`
	// Roots, when set, is a PEM bundle of CAs that replace Google's
	// embedded vTPM CAs (tpm.GCERoots): for a CA Google introduces before
	// this release embeds it, or a test CA. Optional.
	Roots string `json:"roots,omitempty"`
	// Intermediates is a PEM bundle of issuing CAs the AK certificates
	// chain through to Roots; only with Roots.
	Intermediates string `json:"intermediates,omitempty"`
}

// AzureTrustedLaunchPolicy constrains the Azure Trusted Launch VMs a policy
// trusts. Exactly one of CertificateIDs and AnyVM is set: Azure's AK
// certificates name no subscription or tenant.
type AzureTrustedLaunchPolicy struct {
	// CertificateIDs are the admitted IDs the AK certificates name: the
	// first label of the certificate's common name (2d056151df3d in
	// CN=2d056151df3d.TrustedVM.Azure.Microsoft), read from the VM's vTPM
	// (NV index 0x01C101D0).
	CertificateIDs []string `json:"certificateIDs,omitempty"`
	// AnyVM admits every Azure Trusted Launch VM of every Azure customer
	// whose AK certificate chains to Microsoft's root: the reference values
	// alone then tell the cluster's nodes from anyone else's.
	AnyVM bool `json:"anyVM,omitempty"`
	// Roots, when set, is a PEM bundle of CAs replacing the embedded Azure
	// vTPM root (a test CA, or a root Microsoft introduces before this
	// release embeds it). Optional.
	Roots string `json:"roots,omitempty"`
	// Intermediates is a PEM bundle of issuing CAs added to the embedded
	// ones ("Global Virtual TPM CA - 01" and "- 03"): Azure's AK
	// certificates carry no AIA URL, so a CA Microsoft introduces before
	// this release embeds it is listed here. Optional.
	Intermediates string `json:"intermediates,omitempty"`
}

// AWSNitroTPMPolicy constrains the NitroTPM instances a policy trusts
// (docs/attestation.md, "Cloud vTPMs: AWS NitroTPM"). Exactly one of
// InstanceIDs and AnyInstance is set: a NitroTPM document names no AWS
// account.
type AWSNitroTPMPolicy struct {
	// ReferenceValues are the SHA-384 PCR values (hex, 48 bytes; the same
	// format as referenceValues) every document must show; at least one,
	// never PCR 15. They are what the Nitro hypervisor vouches for: take
	// them from a golden instance's document.
	ReferenceValues json.RawMessage `json:"referenceValues"`
	// InstanceIDs are the admitted EC2 instance IDs (i-…).
	InstanceIDs []string `json:"instanceIDs,omitempty"`
	// AnyInstance admits every NitroTPM instance of every AWS customer
	// whose document shows the reference values.
	AnyInstance bool `json:"anyInstance,omitempty"`
	// Roots, when set, is a PEM bundle replacing the embedded AWS Nitro
	// root (a test CA). Optional.
	Roots string `json:"roots,omitempty"`
}

// HasAlternatives reports whether some role accepts more than one set of
// reference values (RolePolicy.AlsoAccepted).
func (p Policy) HasAlternatives() bool {
	for _, r := range p.Roles {
		if len(r.AlsoAccepted) > 0 {
			return true
		}
	}
	return false
}

// Decode decodes a Policy from YAML (or JSON) strictly: unknown fields
// are errors.
func Decode(data []byte) (Policy, error) {
	var p Policy
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return p, err
	}
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	err = dec.Decode(&p)
	return p, err
}

// Verifier returns the verifier of p, accepting evidence that satisfies
// any of its roles, and a summary of it for logs. lockPCR is what the
// node-lock PCR must hold (see Appraisal).
func (p Policy) Verifier(now func() time.Time, lockPCR []byte) (attestation.Verifier, string, error) {
	a, err := p.Appraisal(now, lockPCR)
	if err != nil {
		return nil, "", err
	}
	return a, a.Summary, nil
}

// KeyVerifier returns a verifier of p's variant that checks everything
// about evidence except its measurements: for tpm the attestation key's
// trust (p's pinnedAKs, ekRoots, gce, azureTrustedLaunch or akRoots, with
// the key activation), the signature, the nonce and the PCR selection
// p.PCRs; for sev-snp and
// tdx the hardware report (its chain to the vendor's roots or the
// section's, its collateral, TCB minimums, debug off) and the vTPM quote
// it binds, with any launch measurement or MRTD. Only p's variant, PCRs
// and key trust or hardware section are read. It serves to capture
// reference values from a golden node (`gatehouse reference-values
// capture`), whose measurements are what is not known yet; never to admit
// a node.
func (p Policy) KeyVerifier(now func() time.Time) (attestation.Verifier, error) {
	variant, err := attestation.ParseVariant(p.Variant)
	if err != nil {
		return nil, err
	}
	return choose.Verifier(variant, p.appraisal(nil, now, true, false))
}

// commonVerifier compiles what every node of p must show: for tpm the
// quote under p's key trust; for sev-snp and tdx the hardware report and
// the vTPM quote whose key it binds. ref are the common PCR reference
// values (node lock included).
func (p Policy) commonVerifier(variant attestation.Variant, ref measurements.M, now func() time.Time, requireEventLog bool) (attestation.Verifier, error) {
	return choose.Verifier(variant, p.appraisal(ref, now, false, requireEventLog))
}

// appraisal is what the variant's verifier compiles from (package choose).
func (p Policy) appraisal(ref measurements.M, now func() time.Time, capture, requireEventLog bool) choose.Appraisal {
	endorsement, err := parseEndorsement(p, capture)
	return choose.Appraisal{
		PCRs: p.PCRs, ReferenceValues: ref,
		Endorsement: endorsement, EndorsementErr: err, EndorsementSet: p.keyTrustSet(),
		SEVSNP: p.SEVSNP, TDX: p.TDX, Capture: capture, Now: now, RequireEventLog: requireEventLog,
	}
}

// requiresEventLog is RequireEventLog, or its default: whether any of the
// reference value sets lists expected events.
func (p Policy) requiresEventLog(sets ...measurements.M) bool {
	if p.RequireEventLog != nil {
		return *p.RequireEventLog
	}
	for _, m := range sets {
		for _, value := range m {
			if len(value.Events) > 0 {
				return true
			}
		}
	}
	return false
}

// keyTrustSet reports whether any TPM key trust field is set.
func (p Policy) keyTrustSet() bool {
	return strings.TrimSpace(p.AKRoots+p.EKRoots+p.EKIntermediates+strings.Join(p.PinnedAKs, "")) != "" || p.GCE != nil || p.AzureTrustedLaunch != nil || p.AWSNitroTPM != nil
}

// parseEndorsement parses p's key trust; capture leaves awsNitroTPM's
// reference values out (see KeyVerifier).
func parseEndorsement(p Policy, capture bool) (tpm.Endorsement, error) {
	var e tpm.Endorsement
	set := 0
	for _, s := range []string{p.AKRoots, p.EKRoots, strings.Join(p.PinnedAKs, "")} {
		if strings.TrimSpace(s) != "" {
			set++
		}
	}
	if p.GCE != nil {
		set++
	}
	if p.AzureTrustedLaunch != nil {
		set++
	}
	if p.AWSNitroTPM != nil {
		set++
	}
	if set != 1 {
		return e, errors.New("set exactly one of pinnedAKs (registered attestation keys), ekRoots (TPM manufacturers' CAs: " +
			"no registration), gce (Compute Engine vTPMs of allowed projects), azureTrustedLaunch (Azure Trusted Launch vTPMs), " +
			"awsNitroTPM (AWS NitroTPM vTPMs) and akRoots (CAs of attestation key certificates)")
	}
	if strings.TrimSpace(p.EKIntermediates) != "" && strings.TrimSpace(p.EKRoots) == "" {
		return e, errors.New("ekIntermediates is set without ekRoots")
	}
	var err error
	switch {
	case p.GCE != nil:
		if len(p.GCE.Projects) == 0 {
			return e, errors.New("gce.projects is empty: name the projects whose instances may join; " +
				"otherwise every Compute Engine VM of every Google customer would be trusted")
		}
		e.GCE = &tpm.GCEEndorsement{Projects: p.GCE.Projects, Zones: p.GCE.Zones}
		if strings.TrimSpace(p.GCE.Intermediates) != "" && strings.TrimSpace(p.GCE.Roots) == "" {
			return e, errors.New("gce.intermediates is set without gce.roots")
		}
		if strings.TrimSpace(p.GCE.Roots) != "" {
			if e.GCE.Roots, err = attestation.CertPool("gce.roots", p.GCE.Roots); err != nil {
				return e, err
			}
			e.GCE.Intermediates = x509.NewCertPool()
			if strings.TrimSpace(p.GCE.Intermediates) != "" {
				e.GCE.Intermediates, err = attestation.CertPool("gce.intermediates", p.GCE.Intermediates)
			}
		}
		return e, err
	case p.AzureTrustedLaunch != nil:
		e.Azure, err = parseAzureTrustedLaunch(p.AzureTrustedLaunch)
		return e, err
	case p.AWSNitroTPM != nil:
		e.Nitro, err = parseAWSNitroTPM(p.AWSNitroTPM, capture)
		return e, err
	case strings.TrimSpace(p.AKRoots) != "":
		e.Roots, err = attestation.CertPool("akRoots", p.AKRoots)
		return e, err
	case strings.TrimSpace(p.EKRoots) != "":
		if e.EKRoots, err = attestation.CertPool("ekRoots", p.EKRoots); err != nil {
			return e, err
		}
		if strings.TrimSpace(p.EKIntermediates) != "" {
			e.EKIntermediates, err = attestation.CertPool("ekIntermediates", p.EKIntermediates)
		}
		return e, err
	}
	for i, s := range p.PinnedAKs {
		block, _ := pem.Decode([]byte(s))
		if block == nil || block.Type != "PUBLIC KEY" {
			return e, fmt.Errorf("pinnedAKs[%d] is not a PEM PUBLIC KEY", i)
		}
		pub, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return e, fmt.Errorf("pinnedAKs[%d]: %w", i, err)
		}
		e.PinnedKeys = append(e.PinnedKeys, crypto.PublicKey(pub))
	}
	return e, nil
}

// parseAzureTrustedLaunch checks an azureTrustedLaunch section and returns
// its endorsement.
func parseAzureTrustedLaunch(a *AzureTrustedLaunchPolicy) (*tpm.AzureEndorsement, error) {
	if a.AnyVM == (len(a.CertificateIDs) > 0) {
		return nil, errors.New("azureTrustedLaunch: set exactly one of certificateIDs (the IDs the VMs' AK certificates name) " +
			"and anyVM: true (every Azure Trusted Launch VM of every Azure customer; an AK certificate names no subscription)")
	}
	for i, id := range a.CertificateIDs {
		if id == "" || strings.ContainsFunc(id, func(r rune) bool { return r == '.' || r <= ' ' || r > '~' }) {
			return nil, fmt.Errorf("azureTrustedLaunch.certificateIDs[%d] %q is not an ID: the first label of the AK certificate's "+
				"common name, e.g. 2d056151df3d of 2d056151df3d.TrustedVM.Azure.Microsoft", i, id)
		}
	}
	e := &tpm.AzureEndorsement{CertificateIDs: a.CertificateIDs, AnyVM: a.AnyVM}
	var err error
	if strings.TrimSpace(a.Roots) != "" {
		if e.Roots, err = attestation.CertPool("azureTrustedLaunch.roots", a.Roots); err != nil {
			return nil, err
		}
	}
	if strings.TrimSpace(a.Intermediates) != "" {
		if e.Intermediates, err = attestation.CertPool("azureTrustedLaunch.intermediates", a.Intermediates); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// awsInstanceID is an EC2 instance ID.
var awsInstanceID = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)

// parseAWSNitroTPM checks an awsNitroTPM section and returns its
// endorsement; capture accepts any document PCRs, to capture them.
func parseAWSNitroTPM(a *AWSNitroTPMPolicy, capture bool) (*tpm.NitroEndorsement, error) {
	if a.AnyInstance == (len(a.InstanceIDs) > 0) {
		return nil, errors.New("awsNitroTPM: set exactly one of instanceIDs (the admitted EC2 instances) " +
			"and anyInstance: true (every NitroTPM instance of every AWS customer; a NitroTPM document names no account)")
	}
	for i, id := range a.InstanceIDs {
		if !awsInstanceID.MatchString(id) {
			return nil, fmt.Errorf("awsNitroTPM.instanceIDs[%d] %q is not an EC2 instance ID (i- and 8 or 17 hex digits)", i, id)
		}
	}
	e := &tpm.NitroEndorsement{InstanceIDs: a.InstanceIDs, AnyInstance: a.AnyInstance, AnyReferenceValues: capture}
	var err error
	if strings.TrimSpace(a.Roots) != "" {
		if e.Roots, err = attestation.CertPool("awsNitroTPM.roots", a.Roots); err != nil {
			return nil, err
		}
	}
	if capture {
		return e, nil
	}
	if e.ReferenceValues, err = measurements.Parse(a.ReferenceValues, sha512.Size384); err != nil {
		return nil, fmt.Errorf("awsNitroTPM.referenceValues (SHA-384 PCR values, hex, 48 bytes): %w", err)
	}
	if len(e.ReferenceValues) == 0 {
		return nil, errors.New("awsNitroTPM.referenceValues is empty: list the SHA-384 PCR values every instance's document must show")
	}
	if _, ok := e.ReferenceValues[keys.NodeLockPCR]; ok {
		return nil, fmt.Errorf("awsNitroTPM.referenceValues must not set PCR %d: it holds the node lock, checked in the quote", keys.NodeLockPCR)
	}
	return e, nil
}

// keyTrust describes how the policy trusts attestation keys, for its
// summary.
func (p Policy) keyTrust() string {
	switch {
	case p.SEVSNP != nil:
		return fmt.Sprintf("sev-snp-report(launchMeasurements=%d)", len(p.SEVSNP.LaunchMeasurements))
	case p.TDX != nil:
		return "tdx-quote(mrtd=" + p.TDX.MRTD + ")"
	case len(p.PinnedAKs) > 0:
		return fmt.Sprintf("pinned(%d)", len(p.PinnedAKs))
	case p.EKRoots != "":
		return "ekRoots:" + Fingerprint([]byte(p.EKRoots))
	case p.GCE != nil:
		if p.GCE.Roots != "" {
			return fmt.Sprintf("gce(projects=%v zones=%v roots=%s)", p.GCE.Projects, p.GCE.Zones, Fingerprint([]byte(p.GCE.Roots)))
		}
		return fmt.Sprintf("gce(projects=%v zones=%v)", p.GCE.Projects, p.GCE.Zones)
	case p.AWSNitroTPM != nil:
		a := p.AWSNitroTPM
		admits := fmt.Sprintf("instanceIDs=%v", a.InstanceIDs)
		if a.AnyInstance {
			admits = "anyInstance"
		}
		return fmt.Sprintf("awsNitroTPM(%s referenceValues=%s)", admits, Fingerprint(a.ReferenceValues))
	case p.AzureTrustedLaunch != nil:
		a := p.AzureTrustedLaunch
		admits := fmt.Sprintf("certificateIDs=%v", a.CertificateIDs)
		if a.AnyVM {
			admits = "anyVM"
		}
		if a.Roots != "" {
			admits += " roots=" + Fingerprint([]byte(a.Roots))
		}
		if a.Intermediates != "" {
			admits += " intermediates=" + Fingerprint([]byte(a.Intermediates))
		}
		return "azureTrustedLaunch(" + admits + ")"
	default:
		return "akRoots:" + Fingerprint([]byte(p.AKRoots))
	}
}

// Fingerprint returns "sha256:" and the first 16 hex digits of data's
// SHA-256, a short fingerprint for logs.
func Fingerprint(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:8])
}
