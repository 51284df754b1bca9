package snp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/uuid"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
)

var (
	testTCB         = kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}
	testMeasurement = bytes.Repeat([]byte{0xaa}, MeasurementSize)
)

// fakeAMD is go-sev-guest's test-only AMD key hierarchy (ARK → ASK → VCEK),
// certifying testTCB.
type fakeAMD struct{ *snptest.AMD }

func newFakeAMD(t testing.TB) *fakeAMD {
	return &fakeAMD{snptest.NewAMD(t, snptest.Options{TCB: testTCB})}
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
	raw := f.Unsigned(t, snptest.Report{Measurement: spec.measurement, Debug: spec.debug, TCB: &spec.tcb, VMPL: spec.vmpl}, spec.reportData)
	r, s, err := f.Signer.Sign(abi.SignedComponent(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := abi.SetSignature(r, s, raw); err != nil {
		t.Fatal(err)
	}
	chain := &spb.CertificateChain{ArkCert: f.Signer.Ark.Raw, AskCert: f.Signer.Ask.Raw, VcekCert: f.Signer.Vcek.Raw}
	if mutate != nil {
		mutate(raw, chain)
	}
	ev, err := Evidence(raw, abi.CertsFromProto(chain).Marshal(), userData)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func (f *fakeAMD) verifier(t testing.TB, change func(*ReportPolicy)) *ReportVerifier {
	t.Helper()
	p := ReportPolicy{
		LaunchMeasurements: [][]byte{testMeasurement},
		MinimumTCB:         testTCB,
		MinimumLaunchTCB:   testTCB,
		TrustedRoots:       f.Roots(),
	}
	if change != nil {
		change(&p)
	}
	v, err := NewReportVerifier(p, time.Now)
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
		policy   func(*ReportPolicy)
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
			policy:  func(p *ReportPolicy) { p.MinimumTCB.BlSpl = 4 },
			wantErr: attestation.ErrPolicy, wantText: "lower than the policy minimum TCB",
		},
		{
			name: "launch TCB below minimum", spec: good,
			policy:  func(p *ReportPolicy) { p.MinimumLaunchTCB.SnpSpl = 9 },
			wantErr: attestation.ErrPolicy,
		},
		{
			name: "VCEK chain to untrusted roots (real AMD roots)", spec: good,
			policy:  func(p *ReportPolicy) { p.TrustedRoots = nil },
			wantErr: attestation.ErrSignature, wantText: "could not be verified by any trusted roots",
		},
		{
			name: "reported TCB differs from the VCEK's", spec: func() reportSpec { s := good; s.tcb = lowerTCB; return s }(),
			policy:  func(p *ReportPolicy) { p.MinimumTCB, p.MinimumLaunchTCB = lowerTCB, lowerTCB },
			wantErr: attestation.ErrPolicy, wantText: "does not match the TCB of the V",
		},
		{
			name: "stale nonce", spec: good, nonce: bytes.Repeat([]byte{8}, attestation.NonceSize),
			wantErr: attestation.ErrNonce,
		},
		{
			name: "wrong launch measurement", spec: func() reportSpec { s := good; s.measurement = bytes.Repeat([]byte{0xbb}, MeasurementSize); return s }(),
			wantErr: attestation.ErrMeasurement, wantText: "launch measurement bbbb",
		},
		{
			name: "wrong VMPL", spec: good, policy: func(p *ReportPolicy) { p.VMPL = &vmpl1 },
			wantErr: attestation.ErrPolicy, wantText: "VMPL 0 is not 1",
		},
		{
			name: "firmware ABI below the guest policy's minimum", spec: good,
			policy:  func(p *ReportPolicy) { p.GuestPolicy = &abi.SnpPolicy{ABIMajor: 1, ABIMinor: 55} },
			wantErr: attestation.ErrPolicy,
		},
		{
			name: "author key required, none signed the ID key", spec: good,
			policy:  func(p *ReportPolicy) { p.AuthorKeyDigests = [][]byte{bytes.Repeat([]byte{2}, abi.AuthorKeyDigestSize)} },
			wantErr: attestation.ErrPolicy,
		},
		{
			name: "ID block required, none signed the launch", spec: good,
			policy:  func(p *ReportPolicy) { p.IDKeyDigests = [][]byte{bytes.Repeat([]byte{1}, abi.IDKeyDigestSize)} },
			wantErr: attestation.ErrPolicy,
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

// TestExpiredVCEK: a VCEK past its NotAfter is refused, although the rest
// of its chain is valid.
func TestExpiredVCEK(t *testing.T) {
	f := &fakeAMD{snptest.NewAMD(t, snptest.Options{TCB: testTCB, VCEKCreated: time.Now().AddDate(-8, 0, 0)})}
	nonce := bytes.Repeat([]byte{7}, attestation.NonceSize)
	ev := f.evidence(t, reportSpec{reportData: attestation.Binding512(nonce, nil), tcb: testTCB, measurement: testMeasurement}, nil, nil)
	_, err := f.verifier(t, nil).Verify(context.Background(), ev, nonce)
	if !errors.Is(err, attestation.ErrSignature) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("error = %v, want an expired VCEK refused", err)
	}
}

func TestVerifyMalformed(t *testing.T) {
	f := newFakeAMD(t)
	nonce := make([]byte, attestation.NonceSize)
	short, _ := Evidence(make([]byte, abi.ReportSize), nil, nil)
	// A certificate table whose one entry's offset + length wraps around
	// uint32 to within the table (the panic cvm.FuzzVerify found).
	table := make([]byte, 3*24+32)
	vcekGUID := uuid.MustParse(abi.VcekGUID)
	copy(table, vcekGUID[:])
	binary.LittleEndian.PutUint32(table[16:], 72)
	binary.LittleEndian.PutUint32(table[20:], 0xffffffe0) // 72 + that = 40 mod 2^32
	wrapping, _ := Evidence(f.Unsigned(t, snptest.Report{}, make([]byte, 64)), table, nil)
	for name, ev := range map[string][]byte{
		"certificate table entry wrapping around": wrapping,
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
	for _, m := range [][][]byte{nil, {testMeasurement, {1}}} {
		if _, err := NewReportVerifier(ReportPolicy{LaunchMeasurements: m}, time.Now); err == nil {
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
