package choose

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxguest"
)

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

// compile turns the section into the quote verifier's policy; capture
// leaves MRTD and RTMRs out (see Policy.KeyVerifier).
func (t *TDXPolicy) compile(now func() time.Time, capture bool) (tdx.TDQuotePolicy, error) {
	out := tdx.TDQuotePolicy{AnyMRTD: capture, ReferenceValues: measurements.M{}}
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
		if out.TrustedRoots, err = attestation.CertPool("roots", t.Roots); err != nil {
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

// tdxAttester opens the TDX quote attester.
func tdxAttester(AttesterOptions) (attestation.Attester, error) { return tdxguest.New() }

// tdxVerifier compiles variant tdx: the TDX quote against the tdx section,
// and the vTPM quote whose key it binds.
func tdxVerifier(a Appraisal) (attestation.Verifier, error) {
	return confidentialVMVerifier(attestation.VariantTDX, a, func() (attestation.Verifier, error) {
		if a.SEVSNP != nil {
			return nil, errors.New("variant tdx takes a tdx section, not sevSnp")
		}
		section := a.TDX
		if section == nil && !a.Capture {
			return nil, errors.New("variant tdx needs a tdx section: the MRTD (and RTMRs) its quotes must show")
		} else if section == nil {
			section = &TDXPolicy{}
		}
		tp, err := section.compile(a.Now, a.Capture)
		if err != nil {
			return nil, fmt.Errorf("tdx.%w", err)
		}
		return tdx.NewTDQuoteVerifier(tp, a.Now)
	})
}
