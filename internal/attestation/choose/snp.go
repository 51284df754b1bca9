package choose

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snpguest"
)

// SEVSNPPolicy is the hardware section of variant sev-snp: what the AMD
// SEV-SNP attestation report of a node's confidential VM must show
// (docs/attestation.md, "Confidential VMs"; SEV-SNP ABI spec table 22).
type SEVSNPPolicy struct {
	// LaunchMeasurements are the accepted launch MEASUREMENTs, hex, 48
	// bytes each (one per image version); at least one.
	LaunchMeasurements []string `json:"launchMeasurements"`
	// MinimumTCB is the lowest acceptable REPORTED_TCB.
	MinimumTCB SNPTCB `json:"minimumTCB"`
	// MinimumLaunchTCB is the lowest acceptable LAUNCH_TCB; absent: MinimumTCB.
	MinimumLaunchTCB *SNPTCB `json:"minimumLaunchTCB,omitempty"`
	// GuestPolicy is the most the guest policy may allow; absent: anything
	// but debugging, which is always refused.
	GuestPolicy *SNPGuestPolicy `json:"guestPolicy,omitempty"`
	// VMPL, when set, is the VM privilege level reports must come from.
	VMPL *int `json:"vmpl,omitempty"`
	// IDKeyDigests and AuthorKeyDigests (hex SHA-384), when set: the launch
	// must carry an ID block signed by one of these keys.
	IDKeyDigests     []string `json:"idKeyDigests,omitempty"`
	AuthorKeyDigests []string `json:"authorKeyDigests,omitempty"`
	// Roots, when set, replace AMD's roots embedded in Gatehouse: each is
	// a product line's cert_chain as AMD KDS serves it (PEM ASK or ASVK,
	// then ARK). Only for test hierarchies and air-gapped copies of AMD's.
	Roots []string `json:"roots,omitempty"`
	// Collateral fetches what reports lack (a VCEK, the CRLs) from AMD KDS.
	Collateral *CollateralPolicy `json:"collateral,omitempty"`
}

// SNPTCB is a TCB version per component (SEV-SNP ABI spec §2.2).
type SNPTCB struct {
	Bootloader uint8 `json:"bootloader"`
	TEE        uint8 `json:"tee"`
	SNP        uint8 `json:"snp"`
	Microcode  uint8 `json:"microcode"`
}

func (t SNPTCB) parts() kds.TCBParts {
	return kds.TCBParts{BlSpl: t.Bootloader, TeeSpl: t.TEE, SnpSpl: t.SNP, UcodeSpl: t.Microcode}
}

// SNPGuestPolicy is what the guest policy (SEV-SNP ABI spec §4.3) may allow.
type SNPGuestPolicy struct {
	// SMT: simultaneous multithreading may be enabled on the host.
	SMT bool `json:"smt"`
	// MigrationAgent: a migration agent may be associated with the guest.
	MigrationAgent bool `json:"migrationAgent"`
	// MinimumABI is the lowest firmware ABI version, "MAJOR.MINOR".
	MinimumABI string `json:"minimumABI,omitempty"`
}

// compile turns the section into the report verifier's policy; capture
// leaves the launch measurements out (see Policy.KeyVerifier).
func (s *SEVSNPPolicy) compile(now func() time.Time, capture bool) (snp.ReportPolicy, error) {
	out := snp.ReportPolicy{AnyLaunchMeasurement: capture}
	if len(s.LaunchMeasurements) == 0 && !capture {
		return out, errors.New("launchMeasurements is empty: list the launch measurement of each image nodes may boot (gatehouse reference-values capture)")
	}
	if !capture {
		var err error
		if out.LaunchMeasurements, err = hexList("launchMeasurements", s.LaunchMeasurements, snp.MeasurementSize); err != nil {
			return out, err
		}
	}
	out.MinimumTCB = s.MinimumTCB.parts()
	out.MinimumLaunchTCB = out.MinimumTCB
	if s.MinimumLaunchTCB != nil {
		out.MinimumLaunchTCB = s.MinimumLaunchTCB.parts()
	}
	if g := s.GuestPolicy; g != nil {
		gp := abi.SnpPolicy{SMT: g.SMT, MigrateMA: g.MigrationAgent}
		if g.MinimumABI != "" {
			if _, err := fmt.Sscanf(g.MinimumABI, "%d.%d", &gp.ABIMajor, &gp.ABIMinor); err != nil {
				return out, fmt.Errorf("guestPolicy.minimumABI %q: want MAJOR.MINOR, e.g. 1.55", g.MinimumABI)
			}
		}
		out.GuestPolicy = &gp
	}
	if s.VMPL != nil && (*s.VMPL < 0 || *s.VMPL > 3) {
		return out, fmt.Errorf("vmpl %d: want 0-3", *s.VMPL)
	}
	out.VMPL = s.VMPL
	var err error
	if out.IDKeyDigests, err = hexList("idKeyDigests", s.IDKeyDigests, abi.IDKeyDigestSize); err != nil {
		return out, err
	}
	if out.AuthorKeyDigests, err = hexList("authorKeyDigests", s.AuthorKeyDigests, abi.AuthorKeyDigestSize); err != nil {
		return out, err
	}
	if len(s.Roots) > 0 {
		out.TrustedRoots = map[string][]*trust.AMDRootCerts{}
		for i, chain := range s.Roots {
			certs := &trust.ProductCerts{}
			if err := certs.FromKDSCertBytes([]byte(chain)); err != nil {
				return out, fmt.Errorf("roots[%d]: not an AMD KDS cert_chain (PEM ASK or ASVK, then ARK): %w", i, err)
			}
			if certs.Ark == nil {
				return out, fmt.Errorf("roots[%d]: not an AMD KDS cert_chain (PEM ASK or ASVK, then ARK): no ARK", i)
			}
			line, ok := strings.CutPrefix(certs.Ark.Subject.CommonName, "ARK-")
			if !ok {
				return out, fmt.Errorf("roots[%d]: the ARK's common name %q does not name a product line (ARK-<line>)", i, certs.Ark.Subject.CommonName)
			}
			out.TrustedRoots[line] = append(out.TrustedRoots[line], &trust.AMDRootCerts{ProductLine: line, ProductCerts: certs})
		}
	}
	if c := s.Collateral; c != nil {
		cache, err := c.cache("collateral", now)
		if err != nil {
			return out, err
		}
		out.Collateral, out.CheckRevocations = cache, c.CheckRevocations
	}
	return out, nil
}

// snpAttester opens the SEV-SNP report attester through the interface
// o.SNPInterface names.
func snpAttester(o AttesterOptions) (attestation.Attester, error) {
	iface, err := snpguest.ParseInterface(o.SNPInterface)
	if err != nil {
		return nil, fmt.Errorf("--sev-snp-interface: %w", err)
	}
	return snpguest.New(iface)
}

// snpVerifier compiles variant sev-snp: the SEV-SNP report against the
// sevSnp section, and the vTPM quote whose key it binds.
func snpVerifier(a Appraisal) (attestation.Verifier, error) {
	return confidentialVMVerifier(attestation.VariantSNP, a, func() (attestation.Verifier, error) {
		return snpReportVerifier(attestation.VariantSNP, a, "the launch measurements and minimum TCB its reports must show", nil)
	})
}

// snpReportVerifier compiles the sevSnp section of variant v (sev-snp,
// azure-sev-snp); needs says what a missing section lacks; vmpl, when set,
// is the only VMPL v's reports come from (a section naming another is
// refused).
func snpReportVerifier(v attestation.Variant, a Appraisal, needs string, vmpl *int) (*snp.ReportVerifier, error) {
	if a.TDX != nil {
		return nil, fmt.Errorf("variant %s takes a sevSnp section, not tdx", v)
	}
	section := a.SEVSNP
	if section == nil && !a.Capture {
		return nil, fmt.Errorf("variant %s needs a sevSnp section: %s", v, needs)
	} else if section == nil {
		section = &SEVSNPPolicy{}
	}
	if vmpl != nil && section.VMPL != nil && *section.VMPL != *vmpl {
		return nil, fmt.Errorf("sevSnp.vmpl %d: variant %s's reports come from VMPL %d", *section.VMPL, v, *vmpl)
	}
	sp, err := section.compile(a.Now, a.Capture)
	if err != nil {
		return nil, fmt.Errorf("sevSnp.%w", err)
	}
	if vmpl != nil {
		sp.VMPL = vmpl
	}
	return snp.NewReportVerifier(sp, a.Now)
}
