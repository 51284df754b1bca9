package tpm

import (
	"crypto/x509"
	"embed"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/google/go-tpm-tools/server"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// gceRoots holds Google's EK/AK CAs for Compute Engine vTPMs (Shielded and
// Confidential VMs), DER, as published at pki.goog and shipped by
// go-tpm-tools (server/ca-certs): the root and intermediates of the
// original "EK/AK CA" (tpm_ek_root_1, tpm_ek_intermediate_2 and _3) and of
// its CA Service successor (gcp_ek_ak_ca_root, gcp_ek_ak_ca_intermediate_v3).
//
//go:embed gceroots/*.der
var gceRoots embed.FS

// GCEEndorsement trusts Compute Engine vTPMs: the AK certificate that
// Google's vTPM CA issues each instance (read from the vTPM's NV index
// 0x01c10000/0x01c10002 and sent with the evidence) must chain to Google's
// roots, and the instance it names must be in an allowed project (and zone,
// when Zones is set). The instance becomes part of the result
// (Result.Endorsement).
type GCEEndorsement struct {
	// Projects are the allowed project IDs; at least one, or any Compute
	// Engine VM of any Google customer would be trusted.
	Projects []string
	// Zones, when set, are the allowed zones (e.g. "us-central1-a").
	Zones []string
	// Roots and Intermediates override Google's CAs (tests); nil uses
	// googleRoots.
	Roots, Intermediates *x509.CertPool
}

// googleRoots returns Google's vTPM EK/AK root CAs and intermediates.
func googleRoots() (roots, intermediates *x509.CertPool, err error) {
	entries, err := gceRoots.ReadDir("gceroots")
	if err != nil {
		return nil, nil, err
	}
	roots, intermediates = x509.NewCertPool(), x509.NewCertPool()
	for _, e := range entries {
		der, err := gceRoots.ReadFile(path.Join("gceroots", e.Name()))
		if err != nil {
			return nil, nil, err
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, fmt.Errorf("embedded Google CA %s: %w", e.Name(), err)
		}
		if strings.Contains(e.Name(), "root") {
			roots.AddCert(cert)
		} else {
			intermediates.AddCert(cert)
		}
	}
	return roots, intermediates, nil
}

// verify checks a Compute Engine AK certificate chain (leaf first) for
// key and the instance it names, and returns a description of the
// instance and the instance. Errors wrap attestation.ErrUntrustedKey
// (chain, no instance) or attestation.ErrPolicy (an instance outside the
// allowed projects or zones).
func (e *GCEEndorsement) verify(chain [][]byte, key any, v *QuoteVerifier) (string, *attestation.GCEInstance, error) {
	leaf, err := v.verifyChain(chain, key, e.Roots, e.Intermediates)
	if err != nil {
		return "", nil, err
	}
	info, err := server.GetGCEInstanceInfo(leaf)
	if err != nil {
		return "", nil, fmt.Errorf("%w: AK certificate: %w", attestation.ErrMalformed, err)
	}
	if info == nil {
		return "", nil, fmt.Errorf("%w: the AK certificate names no production Compute Engine instance", attestation.ErrUntrustedKey)
	}
	if !slices.Contains(e.Projects, info.GetProjectId()) {
		return "", nil, fmt.Errorf("%w: instance %s is in project %q, which the policy does not allow (gce.projects: %v)",
			attestation.ErrPolicy, info.GetInstanceName(), info.GetProjectId(), e.Projects)
	}
	if len(e.Zones) > 0 && !slices.Contains(e.Zones, info.GetZone()) {
		return "", nil, fmt.Errorf("%w: instance %s is in zone %q, which the policy does not allow (gce.zones: %v)",
			attestation.ErrPolicy, info.GetInstanceName(), info.GetZone(), e.Zones)
	}
	instance := &attestation.GCEInstance{ProjectID: info.GetProjectId(), Zone: info.GetZone(), Name: info.GetInstanceName(), ID: info.GetInstanceId()}
	return fmt.Sprintf("gce-instance project=%s zone=%s instance=%s id=%d resource=%s", info.GetProjectId(), info.GetZone(),
		info.GetInstanceName(), info.GetInstanceId(), server.GCEInstanceResourceName(info)), instance, nil
}
