package policy

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/collateral"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx"
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

// TDXPolicy is the hardware section of variant tdx: what the Intel TDX
// quote of a node's confidential VM must show (Intel TDX DCAP quote
// library, appendix A.3).
type TDXPolicy struct {
	// MRTD is the expected measurement of the TD's initial contents, hex
	// 48 bytes.
	MRTD string `json:"mrtd"`
	// RTMRs, when set, are expected runtime measurement registers by index
	// 0-3, hex 48 bytes.
	RTMRs map[int]string `json:"rtmrs,omitempty"`
	// MrSeam and MrSignerSeam, when set: the TDX module and its signer.
	MrSeam       string `json:"mrSeam,omitempty"`
	MrSignerSeam string `json:"mrSignerSeam,omitempty"`
	// TdAttributes and Xfam, when set: exact values, hex 8 bytes. A
	// debuggable TD is always refused.
	TdAttributes string `json:"tdAttributes,omitempty"`
	Xfam         string `json:"xfam,omitempty"`
	// MinimumTeeTcbSvn is the lowest TEE_TCB_SVN, hex 16 bytes, per byte.
	MinimumTeeTcbSvn string `json:"minimumTeeTcbSvn,omitempty"`
	// MinimumQeSvn and MinimumPceSvn: the quoting and provisioning
	// certification enclaves' lowest security versions.
	MinimumQeSvn  uint16 `json:"minimumQeSvn,omitempty"`
	MinimumPceSvn uint16 `json:"minimumPceSvn,omitempty"`
	// QeVendorID, when set, hex 16 bytes (Intel's:
	// 939a7233f79c4ca9940a0db3957f0607).
	QeVendorID string `json:"qeVendorID,omitempty"`
	// Roots, when set, replace the Intel SGX Root CA embedded in Gatehouse
	// (PEM bundle). Only for test hierarchies.
	Roots string `json:"roots,omitempty"`
	// Collateral fetches TCB info, QE identity and CRLs from Intel PCS.
	Collateral *CollateralPolicy `json:"collateral,omitempty"`
}

// CollateralPolicy says where a verifier gets the vendor's collateral.
type CollateralPolicy struct {
	// CacheDir holds fetched collateral (one file per URL); required.
	CacheDir string `json:"cacheDir"`
	// Offline: never fetch; serve only what CacheDir holds (fill it online
	// once). A CRL or TCB info past its next update is then refused.
	Offline bool `json:"offline,omitempty"`
	// CheckRevocations refuses certificates the vendor's CRLs revoke, and
	// evidence whose CRL cannot be had fresh.
	CheckRevocations bool `json:"checkRevocations"`
}

func (c *CollateralPolicy) cache(field string, now func() time.Time) (*collateral.Cache, error) {
	if strings.TrimSpace(c.CacheDir) == "" {
		return nil, fmt.Errorf("%s.cacheDir is empty: name a directory for fetched collateral", field)
	}
	cache := &collateral.Cache{Dir: c.CacheDir, Now: now}
	if !c.Offline {
		cache.Upstream = collateral.HTTP(nil)
	}
	return cache, nil
}

// hexField decodes a hex field of size bytes ("" gives nil).
func hexField(field, s string, size int) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%s is not hex: %w", field, err)
	}
	if len(b) != size {
		return nil, fmt.Errorf("%s has %d bytes, want %d", field, len(b), size)
	}
	return b, nil
}

// hexList decodes a list of hex fields of size bytes each.
func hexList(field string, in []string, size int) ([][]byte, error) {
	var out [][]byte
	for i, s := range in {
		b, err := hexField(fmt.Sprintf("%s[%d]", field, i), s, size)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// hardwareVerifier compiles the hardware section of p's variant. With
// capture (Policy.KeyVerifier) the section may be absent, and any launch
// measurement or MRTD is accepted.
func (p Policy) hardwareVerifier(variant attestation.Variant, now func() time.Time, capture bool) (attestation.Verifier, error) {
	switch variant {
	case attestation.VariantSNP:
		if p.TDX != nil {
			return nil, errors.New("variant sev-snp takes a sevSnp section, not tdx")
		}
		section := p.SEVSNP
		if section == nil && !capture {
			return nil, errors.New("variant sev-snp needs a sevSnp section: the launch measurements and minimum TCB its reports must show")
		} else if section == nil {
			section = &SEVSNPPolicy{}
		}
		sp, err := section.compile(now, capture)
		if err != nil {
			return nil, fmt.Errorf("sevSnp.%w", err)
		}
		return snp.NewVerifier(sp, now)
	case attestation.VariantTDX:
		if p.SEVSNP != nil {
			return nil, errors.New("variant tdx takes a tdx section, not sevSnp")
		}
		section := p.TDX
		if section == nil && !capture {
			return nil, errors.New("variant tdx needs a tdx section: the MRTD (and RTMRs) its quotes must show")
		} else if section == nil {
			section = &TDXPolicy{}
		}
		tp, err := section.compile(now, capture)
		if err != nil {
			return nil, fmt.Errorf("tdx.%w", err)
		}
		return tdx.NewVerifier(tp, now)
	}
	return nil, fmt.Errorf("variant %q has no hardware section", variant)
}

// compile turns the section into the report verifier's policy; capture
// leaves the launch measurements out (see Policy.KeyVerifier).
func (s *SEVSNPPolicy) compile(now func() time.Time, capture bool) (snp.Policy, error) {
	out := snp.Policy{AnyLaunchMeasurement: capture}
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

// compile turns the section into the quote verifier's policy; capture
// leaves MRTD and RTMRs out (see Policy.KeyVerifier).
func (t *TDXPolicy) compile(now func() time.Time, capture bool) (tdx.Policy, error) {
	out := tdx.Policy{AnyMRTD: capture, ReferenceValues: measurements.M{}}
	if !capture {
		if t.MRTD == "" {
			return out, errors.New("mrtd is empty: name the MRTD of the image nodes boot (gatehouse reference-values capture)")
		}
		mrtd, err := hexField("mrtd", t.MRTD, tdx.MeasurementSize)
		if err != nil {
			return out, err
		}
		out.ReferenceValues[0] = measurements.Measurement{Expected: mrtd}
	}
	var err error
	for index, v := range t.RTMRs {
		if capture {
			break
		}
		if index < 0 || index > 3 {
			return out, fmt.Errorf("rtmrs.%d: want an index 0-3", index)
		}
		b, err := hexField(fmt.Sprintf("rtmrs.%d", index), v, tdx.MeasurementSize)
		if err != nil {
			return out, err
		}
		out.ReferenceValues[uint32(index+1)] = measurements.Measurement{Expected: b}
	}
	for _, f := range []struct {
		name string
		in   string
		size int
		out  *[]byte
	}{
		{"mrSeam", t.MrSeam, tdx.MeasurementSize, &out.MrSeam}, {"mrSignerSeam", t.MrSignerSeam, tdx.MeasurementSize, &out.MrSignerSeam},
		{"tdAttributes", t.TdAttributes, 8, &out.TdAttributes}, {"xfam", t.Xfam, 8, &out.Xfam},
		{"minimumTeeTcbSvn", t.MinimumTeeTcbSvn, 16, &out.MinimumTeeTcbSvn}, {"qeVendorID", t.QeVendorID, 16, &out.QeVendorID},
	} {
		if *f.out, err = hexField(f.name, f.in, f.size); err != nil {
			return out, err
		}
	}
	out.MinimumQeSvn, out.MinimumPceSvn = t.MinimumQeSvn, t.MinimumPceSvn
	if strings.TrimSpace(t.Roots) != "" {
		if out.TrustedRoots, err = certPool("roots", t.Roots); err != nil {
			return out, err
		}
	}
	if c := t.Collateral; c != nil {
		cache, err := c.cache("collateral", now)
		if err != nil {
			return out, err
		}
		out.Collateral, out.CheckRevocations = cache.TDX(), c.CheckRevocations
	}
	return out, nil
}
