package snp

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	test "github.com/google/go-sev-guest/testing"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

var (
	testTCB         = kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}
	testMeasurement = bytes.Repeat([]byte{0xaa}, MeasurementSize)
)

// fakeAMD is go-sev-guest's test-only AMD key hierarchy (ARK → ASK → VCEK),
// certifying testTCB.
type fakeAMD struct {
	signer *test.AmdSigner
	roots  map[string][]*trust.AMDRootCerts
}

func newFakeAMD(t testing.TB) *fakeAMD {
	t.Helper()
	created := time.Now().Add(-time.Hour)
	product := kds.ProductName(abi.DefaultSevProduct())
	signer, err := (&test.AmdSignerBuilder{
		Keys: test.DefaultAmdKeys(), ProductName: product, CSPID: "gatehouse-test",
		ArkCreationTime: created, AskCreationTime: created, AsvkCreationTime: created,
		VcekCreationTime: created, VlekCreationTime: created,
		VcekCustom: test.CertOverride{Extensions: test.CustomExtensions(testTCB, make([]byte, abi.ChipIDSize), "", product)},
	}).TestOnlyCertChain()
	if err != nil {
		t.Fatal(err)
	}
	return &fakeAMD{signer: signer, roots: map[string][]*trust.AMDRootCerts{"Milan": {{
		ProductLine: "Milan", ProductCerts: &trust.ProductCerts{Ark: signer.Ark, Ask: signer.Ask, Asvk: signer.Asvk},
	}}}}
}

// reportSpec describes a report to sign.
type reportSpec struct {
	reportData  []byte
	debug       bool
	tcb         kds.TCBParts
	measurement []byte
	vmpl        uint32
}

// evidence signs a report for spec and wraps it with the certificate table.
func (f *fakeAMD) evidence(t testing.TB, spec reportSpec, userData []byte, mutate func(raw []byte, chain *spb.CertificateChain)) []byte {
	t.Helper()
	tcb, err := kds.ComposeTCBParts(spec.tcb)
	if err != nil {
		t.Fatal(err)
	}
	rep := &spb.Report{
		Version: 2, Policy: abi.SnpPolicyToBytes(abi.SnpPolicy{Debug: spec.debug}), SignatureAlgo: abi.SignEcdsaP384Sha384,
		Vmpl: spec.vmpl, ReportData: spec.reportData, Measurement: spec.measurement,
		FamilyId: make([]byte, abi.FamilyIDSize), ImageId: make([]byte, abi.ImageIDSize),
		HostData: make([]byte, abi.HostDataSize), IdKeyDigest: make([]byte, abi.IDKeyDigestSize),
		AuthorKeyDigest: make([]byte, abi.AuthorKeyDigestSize), ReportId: make([]byte, abi.ReportIDSize),
		ReportIdMa: make([]byte, abi.ReportIDMASize), ChipId: make([]byte, abi.ChipIDSize),
		CurrentTcb: uint64(tcb), ReportedTcb: uint64(tcb), CommittedTcb: uint64(tcb), LaunchTcb: uint64(tcb),
		Signature: make([]byte, abi.SignatureSize),
	}
	raw, err := abi.ReportToAbiBytes(rep)
	if err != nil {
		t.Fatal(err)
	}
	r, s, err := f.signer.Sign(abi.SignedComponent(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := abi.SetSignature(r, s, raw); err != nil {
		t.Fatal(err)
	}
	chain := &spb.CertificateChain{ArkCert: f.signer.Ark.Raw, AskCert: f.signer.Ask.Raw, VcekCert: f.signer.Vcek.Raw}
	if mutate != nil {
		mutate(raw, chain)
	}
	ev, err := Evidence(raw, abi.CertsFromProto(chain).Marshal(), userData)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func (f *fakeAMD) verifier(t testing.TB, change func(*Policy)) *Verifier {
	t.Helper()
	p := Policy{
		ReferenceValues:  measurements.M{0: {Expected: testMeasurement}},
		MinimumTCB:       testTCB,
		MinimumLaunchTCB: testTCB,
		TrustedRoots:     f.roots,
	}
	if change != nil {
		change(&p)
	}
	v, err := NewVerifier(p, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVerify(t *testing.T) {
	f := newFakeAMD(t)
	nonce := bytes.Repeat([]byte{7}, attestation.NonceSize)
	userData := []byte("tls key hash")
	good := reportSpec{reportData: attestation.Binding512(nonce, userData), tcb: testTCB, measurement: testMeasurement}
	vmpl1 := 1
	lowerTCB := testTCB
	lowerTCB.BlSpl = 2

	tests := []struct {
		name     string
		spec     reportSpec
		mutate   func(raw []byte, chain *spb.CertificateChain)
		policy   func(*Policy)
		nonce    []byte
		wantErr  error
		wantText string
	}{
		{name: "genuine report verifies", spec: good},
		{
			name: "debug policy", spec: func() reportSpec { s := good; s.debug = true; return s }(),
			wantErr: attestation.ErrPolicy, wantText: "guest policy allows debugging",
		},
		{
			name: "TCB below minimum", spec: good,
			policy:  func(p *Policy) { p.MinimumTCB.BlSpl = 4 },
			wantErr: attestation.ErrPolicy, wantText: "lower than the policy minimum TCB",
		},
		{
			name: "launch TCB below minimum", spec: good,
			policy:  func(p *Policy) { p.MinimumLaunchTCB.SnpSpl = 9 },
			wantErr: attestation.ErrPolicy,
		},
		{
			name: "VCEK chain to untrusted roots (real AMD roots)", spec: good,
			policy:  func(p *Policy) { p.TrustedRoots = nil },
			wantErr: attestation.ErrSignature, wantText: "could not be verified by any trusted roots",
		},
		{
			name: "reported TCB differs from the VCEK's", spec: func() reportSpec { s := good; s.tcb = lowerTCB; return s }(),
			policy:  func(p *Policy) { p.MinimumTCB, p.MinimumLaunchTCB = lowerTCB, lowerTCB },
			wantErr: attestation.ErrPolicy, wantText: "does not match the TCB of the V",
		},
		{
			name: "stale nonce", spec: good, nonce: bytes.Repeat([]byte{8}, attestation.NonceSize),
			wantErr: attestation.ErrNonce,
		},
		{
			name: "wrong launch measurement", spec: func() reportSpec { s := good; s.measurement = bytes.Repeat([]byte{0xbb}, MeasurementSize); return s }(),
			wantErr: attestation.ErrMeasurement, wantText: "index 0: expected aaaa",
		},
		{
			name: "wrong VMPL", spec: good, policy: func(p *Policy) { p.VMPL = &vmpl1 },
			wantErr: attestation.ErrPolicy, wantText: "VMPL 0 is not 1",
		},
		{
			name: "tampered report", spec: good,
			mutate:  func(raw []byte, _ *spb.CertificateChain) { raw[0x50] ^= 1 }, // a REPORT_DATA byte
			wantErr: attestation.ErrSignature,
		},
		{
			name: "no VCEK in the certificate table", spec: good,
			mutate:  func(_ []byte, chain *spb.CertificateChain) { chain.VcekCert = nil },
			wantErr: attestation.ErrUntrustedKey,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := f.evidence(t, tt.spec, userData, tt.mutate)
			n := nonce
			if tt.nonce != nil {
				n = tt.nonce
			}
			result, err := f.verifier(t, tt.policy).Verify(context.Background(), ev, n)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(result.UserData, userData) || !strings.HasPrefix(result.Identity, "sev-snp-chip:") {
					t.Errorf("result %+v", result)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("error = %v, want %v containing %q", err, tt.wantErr, tt.wantText)
			}
		})
	}
}

func TestVerifyMalformed(t *testing.T) {
	f := newFakeAMD(t)
	nonce := make([]byte, attestation.NonceSize)
	short, _ := Evidence(make([]byte, abi.ReportSize), nil, nil)
	for name, ev := range map[string][]byte{
		"garbage":         []byte("\xff\xffgarbage"),
		"oversized":       make([]byte, attestation.MaxEvidenceSize+1),
		"unsigned report": short,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := f.verifier(t, nil).Verify(context.Background(), ev, nonce); !errors.Is(err, attestation.ErrMalformed) && !errors.Is(err, attestation.ErrUntrustedKey) {
				t.Fatalf("error = %v, want malformed", err)
			}
		})
	}
}

func TestNewVerifierNeedsTheLaunchMeasurement(t *testing.T) {
	for _, m := range []measurements.M{nil, {1: {Expected: testMeasurement}}, {0: {Expected: []byte{1}}}} {
		if _, err := NewVerifier(Policy{ReferenceValues: m}, time.Now); err == nil {
			t.Errorf("reference values %v accepted", m)
		}
	}
}

// FuzzVerify feeds the verifier mutations of genuine evidence: it must never
// panic, and whatever verifies must carry the genuine user data.
func FuzzVerify(f *testing.F) {
	amd := newFakeAMD(f)
	nonce := bytes.Repeat([]byte{7}, attestation.NonceSize)
	userData := []byte("tls key hash")
	f.Add(amd.evidence(f, reportSpec{reportData: attestation.Binding512(nonce, userData), tcb: testTCB, measurement: testMeasurement}, userData, nil))
	f.Add([]byte("\x0a\x04abcd"))
	v := amd.verifier(f, nil)
	f.Fuzz(func(t *testing.T, evidence []byte) {
		result, err := v.Verify(context.Background(), evidence, nonce)
		if err == nil && !bytes.Equal(result.UserData, userData) {
			t.Fatalf("evidence verified with user data %q", result.UserData)
		}
	})
}
