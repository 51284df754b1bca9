package tpm

import (
	"bytes"
	"crypto/x509"
	"embed"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// azureRoots holds Microsoft's CAs for Azure Trusted Launch vTPM AK
// certificates, PEM: the root "Azure Virtual TPM Root Certificate
// Authority 2023" and its issuing CAs "Global Virtual TPM CA - 01" and
// "- 03" (azureroots/README.md says where they come from). The AK
// certificates carry no AIA URL, so the issuing CAs are shipped here.
//
//go:embed azureroots/*.crt
var azureRoots embed.FS

// oidTCGKpAIKCertificate is tcg-kp-AIKCertificate (TCG EK Credential
// Profile), the extended key usage of an attestation key certificate,
// which Azure's vTPM AK certificates carry.
var oidTCGKpAIKCertificate = asn1.ObjectIdentifier{2, 23, 133, 8, 3}

// azureSubjectMarker is in the common name of every Azure Trusted Launch
// AK certificate seen: "<id>.TrustedVM.Azure.Microsoft" or
// "<id>.TrustedVM.Azure.windows.net".
const azureSubjectMarker = ".TrustedVM.Azure."

// AzureEndorsement trusts Azure Trusted Launch vTPMs: the AK certificate
// Azure provisions in the vTPM (NV index 0x01C101D0, for the AK at
// persistent handle 0x81000003), sent with the evidence, must chain to
// "Azure Virtual TPM Root Certificate Authority 2023" through Microsoft's
// issuing CAs, be an AK certificate (tcg-kp-AIKCertificate), and certify
// the AK that signed the quote. The certificate names no subscription or
// tenant, only an ID in its subject, so a policy either lists the IDs it
// admits or says explicitly that it admits any Trusted Launch VM.
type AzureEndorsement struct {
	// CertificateIDs, when set, are the admitted IDs: the first label of
	// the AK certificate's common name (2d056151df3d in
	// "2d056151df3d.TrustedVM.Azure.Microsoft").
	CertificateIDs []string
	// AnyVM admits every Azure Trusted Launch VM, of any Azure customer,
	// whose AK certificate chains to the roots; the reference values are
	// then all that tells the cluster's nodes from anyone else's. Exactly
	// one of CertificateIDs and AnyVM is set.
	AnyVM bool
	// Roots, when set, replace the embedded Azure vTPM root (tests, or a
	// root Microsoft introduces before a release embeds it).
	Roots *x509.CertPool
	// Intermediates are issuing CAs added to the embedded ones (a CA
	// Microsoft introduces before a release embeds it); nil for none.
	Intermediates *x509.CertPool
}

// check reports what is wrong with e as a policy.
func (e *AzureEndorsement) check() error {
	if e.AnyVM == (len(e.CertificateIDs) > 0) {
		return errors.New("tpm policy: Azure needs exactly one of certificate IDs and any-VM: " +
			"an Azure AK certificate names no subscription, so admitting every Trusted Launch VM of every Azure customer must be said")
	}
	return nil
}

// withEmbeddedCAs returns e with the embedded root (unless e.Roots
// replaces it) and with the embedded issuing CAs beside e.Intermediates.
func (e *AzureEndorsement) withEmbeddedCAs() (*AzureEndorsement, error) {
	roots, intermediates, err := azureCAs()
	if err != nil {
		return nil, err
	}
	out := *e
	if out.Roots == nil {
		out.Roots = x509.NewCertPool()
		for _, c := range roots {
			out.Roots.AddCert(c)
		}
	}
	if e.Intermediates != nil {
		out.Intermediates = e.Intermediates.Clone()
	} else {
		out.Intermediates = x509.NewCertPool()
	}
	for _, c := range intermediates {
		out.Intermediates.AddCert(c)
	}
	return &out, nil
}

// azureCAs parses the embedded Azure vTPM CAs: self-signed ones are
// roots, the others issuing CAs.
func azureCAs() (roots, intermediates []*x509.Certificate, err error) {
	entries, err := azureRoots.ReadDir("azureroots")
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		data, err := azureRoots.ReadFile(path.Join("azureroots", e.Name()))
		if err != nil {
			return nil, nil, err
		}
		block, _ := pem.Decode(data)
		if block == nil || block.Type != "CERTIFICATE" {
			return nil, nil, fmt.Errorf("embedded Azure CA %s is not a PEM certificate", e.Name())
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("embedded Azure CA %s: %w", e.Name(), err)
		}
		if bytes.Equal(cert.RawSubject, cert.RawIssuer) {
			roots = append(roots, cert)
		} else {
			intermediates = append(intermediates, cert)
		}
	}
	return roots, intermediates, nil
}

// verify checks an Azure Trusted Launch AK certificate chain (leaf first)
// for key, and returns a description of what the certificate names.
// Errors wrap attestation.ErrUntrustedKey (chain, not an AK certificate)
// or attestation.ErrPolicy (an ID the policy does not admit).
func (e *AzureEndorsement) verify(chain [][]byte, key any, v *QuoteVerifier) (string, error) {
	leaf, err := v.verifyChain(chain, key, e.Roots, e.Intermediates)
	if err != nil {
		return "", err
	}
	if !slices.ContainsFunc(leaf.UnknownExtKeyUsage, oidTCGKpAIKCertificate.Equal) {
		return "", fmt.Errorf("%w: the Azure certificate is not an AK certificate (no tcg-kp-AIKCertificate extended key usage)", attestation.ErrUntrustedKey)
	}
	cn := leaf.Subject.CommonName
	id, _, named := strings.Cut(cn, azureSubjectMarker)
	if !named {
		id = ""
	}
	if !e.AnyVM && (id == "" || !slices.Contains(e.CertificateIDs, id)) {
		return "", fmt.Errorf("%w: the AK certificate's subject %q names an ID the policy does not admit (azureTrustedLaunch.certificateIDs: %v)",
			attestation.ErrPolicy, cn, e.CertificateIDs)
	}
	return fmt.Sprintf("azure-trusted-launch id=%s subject=%q issuer=%q serial=%s",
		id, leaf.Subject.String(), leaf.Issuer.String(), leaf.SerialNumber.Text(16)), nil
}
