package attestation

import (
	"crypto/sha256"
	"encoding/hex"
	"math/big"
	"strconv"
)

// Prefixes of the identities a Result proves (Result.Identities), the
// forms of a deny list's entries (docs/joinservice.md, "Deny list").
const (
	// PrefixAK: "tpm-ak:sha256:<64 hex digits>", SHA-256 of the (v)TPM
	// attestation key's DER SubjectPublicKeyInfo.
	PrefixAK = "tpm-ak:sha256:"
	// PrefixEK: "tpm-ek:<64 hex digits>:<hex serial>" (CertificateName).
	PrefixEK = "tpm-ek:"
	// PrefixSNPChip: "sev-snp-chip:<128 hex digits>", the chip's CHIP_ID.
	PrefixSNPChip = "sev-snp-chip:"
	// PrefixTDXPPID: "tdx-ppid:<32 hex digits>", the platform's PPID.
	PrefixTDXPPID = "tdx-ppid:"
	// PrefixGCEInstance: "gce-instance:<project>/<zone>/<instance ID>"
	// (GCEInstance).
	PrefixGCEInstance = "gce-instance:"
	// PrefixAWSInstance: "aws-instance:<EC2 instance ID>", the instance a
	// NitroTPM attestation document names (Hardware of a tpm result under
	// awsNitroTPM).
	PrefixAWSInstance = "aws-instance:"
)

// CertificateName names one X.509 certificate by its issuer and serial
// number, which together are unique (RFC 5280 §4.1.2.2).
type CertificateName struct {
	// Issuer is the DER encoding of the certificate's issuer Name
	// (x509.Certificate.RawIssuer).
	Issuer []byte
	// Serial is the certificate's serial number.
	Serial *big.Int
}

// Identity returns the name as a deny-list identity:
// "tpm-ek:<lower-case hex SHA-256 of Issuer>:<serial in lower-case hex,
// no leading zeros>", e.g. "tpm-ek:9f86…0a08:1a2b3c". The digest stands
// for the issuer because an issuer's text form has no single spelling.
func (c *CertificateName) Identity() string {
	sum := sha256.Sum256(c.Issuer)
	serial := "0"
	if c.Serial != nil {
		serial = c.Serial.Text(16)
	}
	return PrefixEK + hex.EncodeToString(sum[:]) + ":" + serial
}

// GCEInstance is a Compute Engine instance as the instance-identity
// extension (OID 1.3.6.1.4.1.11129.2.1.21) of its AK certificate names it.
type GCEInstance struct {
	// ProjectID and Zone are where the instance runs ("my-project",
	// "europe-west3-a"); Name is its name, which a later instance may
	// reuse.
	ProjectID, Zone, Name string
	// ID is the instance's numeric ID, never reused.
	ID uint64
}

// Identity returns the instance as a deny-list identity:
// "gce-instance:<project ID>/<zone>/<instance ID in decimal>", e.g.
// "gce-instance:my-project/europe-west3-a/4567890123456789012". The ID,
// not the name, because a name is reused by the next instance created
// with it.
func (g *GCEInstance) Identity() string {
	return PrefixGCEInstance + g.ProjectID + "/" + g.Zone + "/" + strconv.FormatUint(g.ID, 10)
}

// Identities returns every identity r proves, each in the form a deny
// list names it: the attesting key (Identity), the EK certificate that
// endorsed it (EKCertificate), the Compute Engine instance (GCEInstance),
// then the identities of the hardware report (Hardware: the SEV-SNP chip
// or the TDX platform). Empty identities are left out; the result has at
// least one entry for any verified evidence. A relying party refuses
// evidence when any of them is denied.
func (r *Result) Identities() []string {
	if r == nil {
		return nil
	}
	var ids []string
	if r.Identity != "" {
		ids = append(ids, r.Identity)
	}
	if r.EKCertificate != nil {
		ids = append(ids, r.EKCertificate.Identity())
	}
	if r.GCEInstance != nil {
		ids = append(ids, r.GCEInstance.Identity())
	}
	if r.Hardware != nil {
		ids = append(ids, r.Hardware.Identities()...)
	}
	return ids
}
