// Package snptest gives tests an SEV-SNP guest device: go-sev-guest's
// test-only AMD key hierarchy (ARK → ASK → VCEK, keys published in
// go-sev-guest, so nothing it signs is trusted outside a test that names
// its roots) and go-sev-guest's test quote provider, answering any
// REPORT_DATA with a signed report of chosen contents.
package snptest

import (
	"bytes"
	"encoding/hex"
	"encoding/pem"
	"sync"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"
	labi "github.com/google/go-sev-guest/client/linuxabi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	test "github.com/google/go-sev-guest/testing"
	"github.com/google/go-sev-guest/verify/trust"
)

// ProductLine is the product line of the test hierarchy.
const ProductLine = "Milan"

// AMD is a test-only AMD key hierarchy certifying TCB.
type AMD struct {
	Signer *test.AmdSigner
	// TCB is the TCB the VCEK certifies; reports carry it unless told otherwise.
	TCB kds.TCBParts
	// ChipID is the chip's ID (abi.ChipIDSize bytes): the VCEK's HWID, and
	// the CHIP_ID of reports that do not mask it.
	ChipID []byte
}

// DefaultChipID is the chip ID of a hierarchy made without Options.ChipID.
var DefaultChipID = bytes.Repeat([]byte{0xc1}, abi.ChipIDSize)

// Options vary the hierarchy.
type Options struct {
	// TCB the VCEK certifies.
	TCB kds.TCBParts
	// Created is when the certificates' validity starts (zero: an hour ago).
	Created time.Time
	// VCEKCreated, when set, is when the VCEK was made (it is valid for
	// seven years from then), e.g. long ago for an expired VCEK.
	VCEKCreated time.Time
	// ChipID is the chip's ID, abi.ChipIDSize bytes (nil: DefaultChipID).
	ChipID []byte
}

// NewAMD makes a hierarchy.
func NewAMD(t testing.TB, opts Options) *AMD {
	t.Helper()
	created := opts.Created
	if created.IsZero() {
		created = time.Now().Add(-time.Hour)
	}
	chip := opts.ChipID
	if chip == nil {
		chip = DefaultChipID
	}
	product := kds.ProductName(abi.DefaultSevProduct())
	vcek := test.CertOverride{Extensions: test.CustomExtensions(opts.TCB, chip, "", product)}
	vcekCreated := created
	if !opts.VCEKCreated.IsZero() {
		vcekCreated = opts.VCEKCreated
	}
	signer, err := (&test.AmdSignerBuilder{
		Keys: test.DefaultAmdKeys(), ProductName: product, CSPID: "gatehouse-test",
		ArkCreationTime: created, AskCreationTime: created, AsvkCreationTime: created,
		VcekCreationTime: vcekCreated, VlekCreationTime: created, VcekCustom: vcek,
	}).TestOnlyCertChain()
	if err != nil {
		t.Fatal(err)
	}
	return &AMD{Signer: signer, TCB: opts.TCB, ChipID: bytes.Clone(chip)}
}

// Roots returns the hierarchy's ARK and ASK as go-sev-guest trusted roots.
func (a *AMD) Roots() map[string][]*trust.AMDRootCerts {
	return map[string][]*trust.AMDRootCerts{ProductLine: {{
		ProductLine: ProductLine, ProductCerts: &trust.ProductCerts{Ark: a.Signer.Ark, Ask: a.Signer.Ask, Asvk: a.Signer.Asvk},
	}}}
}

// CertChainPEM returns the ASK and ARK as PEM, in the form of AMD KDS's
// cert_chain document (a policy's sevSnp.roots entry).
func (a *AMD) CertChainPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Signer.Ask.Raw})) +
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Signer.Ark.Raw}))
}

// Report is what a signed report holds besides REPORT_DATA.
type Report struct {
	Measurement []byte
	// Debug sets the guest policy's DEBUG bit.
	Debug bool
	// TCB is the reported TCB; zero means the AMD's.
	TCB  *kds.TCBParts
	VMPL uint32
	// MaskChipID makes the report's CHIP_ID zeros, as a host that sets
	// MASK_CHIP_ID does (SNP ABI spec §7.3).
	MaskChipID bool
}

// Unsigned returns r's report (abi.ReportSize bytes) with reportData and a
// zero signature.
func (a *AMD) Unsigned(t testing.TB, r Report, reportData []byte) []byte {
	t.Helper()
	tcbParts := a.TCB
	if r.TCB != nil {
		tcbParts = *r.TCB
	}
	tcb, err := kds.ComposeTCBParts(tcbParts)
	if err != nil {
		t.Fatal(err)
	}
	measurement := r.Measurement
	if measurement == nil {
		measurement = make([]byte, abi.MeasurementSize)
	}
	chip := bytes.Clone(a.ChipID)
	if r.MaskChipID || chip == nil {
		chip = make([]byte, abi.ChipIDSize)
	}
	rep := &spb.Report{
		Version: 2, Policy: abi.SnpPolicyToBytes(abi.SnpPolicy{Debug: r.Debug}), SignatureAlgo: abi.SignEcdsaP384Sha384,
		Vmpl: r.VMPL, ReportData: reportData, Measurement: measurement,
		FamilyId: make([]byte, abi.FamilyIDSize), ImageId: make([]byte, abi.ImageIDSize),
		HostData: make([]byte, abi.HostDataSize), IdKeyDigest: make([]byte, abi.IDKeyDigestSize),
		AuthorKeyDigest: make([]byte, abi.AuthorKeyDigestSize), ReportId: make([]byte, abi.ReportIDSize),
		ReportIdMa: make([]byte, abi.ReportIDMASize), ChipId: chip,
		CurrentTcb: uint64(tcb), ReportedTcb: uint64(tcb), CommittedTcb: uint64(tcb), LaunchTcb: uint64(tcb),
		Signature: make([]byte, abi.SignatureSize),
	}
	raw, err := abi.ReportToAbiBytes(rep)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// Device is go-sev-guest's test quote provider for reports of one Report:
// whatever REPORT_DATA a guest asks for, the answer is that report, signed
// by the VCEK, followed by the certificate table. Safe for concurrent use.
type Device struct {
	amd      *AMD
	report   Report
	t        testing.TB
	mu       sync.Mutex
	provider *test.QuoteProvider
}

var _ client.QuoteProvider = (*Device)(nil)

// Device returns a device answering with reports of r.
func (a *AMD) Device(t testing.TB, r Report) *Device {
	t.Helper()
	provider, err := test.TcQuoteProvider(nil, &test.DeviceOptions{Signer: a.Signer, Product: abi.DefaultSevProduct()})
	if err != nil {
		t.Fatal(err)
	}
	return &Device{amd: a, report: r, t: t, provider: provider}
}

// IsSupported reports true.
func (d *Device) IsSupported() bool { return true }

// Product returns the test product.
func (d *Device) Product() *spb.SevProduct { return d.provider.Product() }

// GetRawQuote returns a signed report for reportData and the certificate table.
func (d *Device) GetRawQuote(reportData [64]byte) ([]uint8, error) {
	var out [labi.SnpReportRespReportSize]byte
	copy(out[:], d.amd.Unsigned(d.t, d.report, reportData[:]))
	d.mu.Lock()
	defer d.mu.Unlock()
	d.provider.Device.ReportDataRsp[hex.EncodeToString(reportData[:])] = &test.GetReportResponse{Resp: labi.SnpReportRespABI{Data: out}}
	return d.provider.GetRawQuote(reportData)
}
