package cvm_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tpm-tools/simulator"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/cvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snpguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

var (
	pcrs          = []int{4, 15}
	tcb           = kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}
	snpLaunch     = bytes.Repeat([]byte{0xaa}, snp.MeasurementSize)
	tdxMRTD       = bytes.Repeat([]byte{0xbb}, tdx.MeasurementSize)
	boot          = []tpm.Artefact{tpm.BytesArtefact(4, "node image", []byte("v1"))}
	nonce         = bytes.Repeat([]byte{7}, attestation.NonceSize)
	tlsKeyHash    = []byte("hash of the TLS key")
	anotherVTPMAK = []byte("the TPMT_PUBLIC of another VM's vTPM key")
)

// platform is one confidential VM platform under test: a way to make a
// hardware attester of chosen contents and the matching verifier.
type platform struct {
	variant  attestation.Variant
	attester func(t testing.TB, launch []byte, debug bool) attestation.Attester
	verifier func(t testing.TB) attestation.Verifier
}

func platforms(t testing.TB) []platform {
	amd := snptest.NewAMD(t, snptest.Options{TCB: tcb})
	intel := tdxtest.NewIntel(t)
	return []platform{{
		variant: attestation.VariantSNP,
		attester: func(t testing.TB, launch []byte, debug bool) attestation.Attester {
			a, err := snpguest.NewWithProvider(amd.Device(t, snptest.Report{Measurement: launch, Debug: debug}))
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		verifier: func(t testing.TB) attestation.Verifier {
			v, err := snp.NewReportVerifier(snp.ReportPolicy{LaunchMeasurements: [][]byte{snpLaunch}, MinimumTCB: tcb, TrustedRoots: amd.Roots()}, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			return v
		},
	}, {
		variant: attestation.VariantTDX,
		attester: func(t testing.TB, launch []byte, debug bool) attestation.Attester {
			a, err := tdxguest.NewWithProvider(intel.Device(t, func(b *pb.TDQuoteBody) {
				b.MrTd = launch
				if debug {
					b.TdAttributes[0] |= 1
				}
			}))
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		verifier: func(t testing.TB) attestation.Verifier {
			v, err := tdx.NewTDQuoteVerifier(tdx.TDQuotePolicy{ReferenceValues: measurements.M{0: {Expected: tdxMRTD}}, TrustedRoots: intel.Roots()}, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			return v
		},
	}}
}

// vTPM returns an attester on the simulator, measured as boot says.
func vTPM(t testing.TB) *tpmattester.QuoteAttester {
	t.Helper()
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	if _, err := tpmattester.MeasureBoot(sim, boot); err != nil {
		t.Fatal(err)
	}
	a, err := tpmattester.New(sim, tpmattester.Options{PCRs: pcrs})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func verifier(t testing.TB, p platform, change func(*tpm.QuotePolicy)) *cvm.CompositeVerifier {
	t.Helper()
	ref, err := tpm.ReferenceValues(boot, pcrs)
	if err != nil {
		t.Fatal(err)
	}
	policy := tpm.QuotePolicy{PCRs: pcrs, ReferenceValues: ref}
	if change != nil {
		change(&policy)
	}
	vtpm, err := tpm.NewBoundVerifier(policy, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cvm.NewCompositeVerifier(p.variant, p.verifier(t), vtpm)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestConfidentialVM: genuine evidence of each platform verifies, naming
// the vTPM key as the identity and the hardware's measurement; each
// refusal names its reason.
func TestConfidentialVM(t *testing.T) {
	vtpm := vTPM(t)
	wantIdentity, err := vtpm.Identity()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range platforms(t) {
		launch := snpLaunch
		if p.variant == attestation.VariantTDX {
			launch = tdxMRTD
		}
		attest := func(t *testing.T, hw attestation.Attester) []byte {
			t.Helper()
			a, err := cvm.NewCompositeAttester(hw, vtpm)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := a.Attest(context.Background(), tlsKeyHash, nonce)
			if err != nil {
				t.Fatal(err)
			}
			return ev
		}
		// reassemble swaps the hardware part of genuine evidence.
		reassemble := func(t *testing.T, genuine, hardware []byte) []byte {
			t.Helper()
			ev := &attestationv1.ConfidentialVMEvidence{}
			if err := proto.Unmarshal(genuine, ev); err != nil {
				t.Fatal(err)
			}
			ev.Hardware = hardware
			out, err := proto.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
		t.Run(string(p.variant), func(t *testing.T) {
			genuine := attest(t, p.attester(t, launch, false))
			result, err := verifier(t, p, nil).Verify(context.Background(), genuine, nonce)
			if err != nil {
				t.Fatal(err)
			}
			if result.Variant != p.variant || result.Identity != wantIdentity || !bytes.Equal(result.UserData, tlsKeyHash) ||
				result.Hardware == nil || !bytes.Equal(result.Hardware.Measurements[0], launch) ||
				!strings.HasPrefix(result.Endorsement, string(p.variant)+" ") {
				t.Fatalf("result: variant %s identity %s (want %s) user data %q endorsement %q", result.Variant, result.Identity, wantIdentity, result.UserData, result.Endorsement)
			}

			otherKey, err := p.attester(t, launch, false).Attest(context.Background(), anotherVTPMAK, nonce)
			if err != nil {
				t.Fatal(err)
			}
			otherNonce, err := p.attester(t, launch, false).Attest(context.Background(), mustAK(t, genuine), bytes.Repeat([]byte{8}, attestation.NonceSize))
			if err != nil {
				t.Fatal(err)
			}
			tests := []struct {
				name     string
				evidence []byte
				policy   func(*tpm.QuotePolicy)
				wantErr  error
				wantText string
			}{
				{name: "report binds another vTPM's key", evidence: reassemble(t, genuine, otherKey), wantErr: attestation.ErrUntrustedKey, wantText: "not the key the hardware report binds"},
				{name: "report made for another nonce", evidence: reassemble(t, genuine, otherNonce), wantErr: attestation.ErrNonce},
				{name: "other launch measurement", evidence: attest(t, p.attester(t, bytes.Repeat([]byte{0xcc}, 48), false)), wantErr: attestation.ErrMeasurement},
				{name: "debuggable guest", evidence: attest(t, p.attester(t, launch, true)), wantErr: attestation.ErrPolicy, wantText: "debug"},
				{
					name: "PCRs differ from the reference values", evidence: genuine,
					policy:  func(p *tpm.QuotePolicy) { p.ReferenceValues = measurements.M{4: {Expected: make([]byte, 32)}} },
					wantErr: attestation.ErrMeasurement,
				},
				{name: "no hardware report", evidence: reassemble(t, genuine, nil), wantErr: attestation.ErrMalformed},
				{name: "garbage", evidence: []byte("\xff\x00garbage"), wantErr: attestation.ErrMalformed},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					_, err := verifier(t, p, tt.policy).Verify(context.Background(), tt.evidence, nonce)
					if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
						t.Fatalf("error = %v, want %v containing %q", err, tt.wantErr, tt.wantText)
					}
				})
			}
		})
	}
}

// TestBoundVerifierAdmitsNothingAlone: a vTPM verifier without a hardware
// report to bind its key refuses every quote through the plain Verify.
func TestBoundVerifierAdmitsNothingAlone(t *testing.T) {
	vtpm := vTPM(t)
	quote, err := vtpm.Attest(context.Background(), tlsKeyHash, nonce)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpm.NewBoundVerifier(tpm.QuotePolicy{PCRs: pcrs}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), quote, nonce); !errors.Is(err, attestation.ErrUntrustedKey) {
		t.Fatalf("Verify on a bound verifier = %v, want untrusted key", err)
	}
	if _, err := v.VerifyExtraData(context.Background(), quote, nonce); !errors.Is(err, attestation.ErrUntrustedKey) {
		t.Fatalf("VerifyExtraData on a bound verifier = %v, want untrusted key", err)
	}
	if _, err := v.VerifyBound(context.Background(), quote, nonce, nil); !errors.Is(err, attestation.ErrUntrustedKey) {
		t.Fatalf("VerifyBound without a key = %v, want untrusted key", err)
	}
	if _, err := tpm.NewBoundVerifier(tpm.QuotePolicy{PCRs: pcrs, Endorsement: tpm.Endorsement{PinnedKeys: nil, GCE: &tpm.GCEEndorsement{Projects: []string{"p"}}}}, time.Now); err == nil {
		t.Fatal("a bound verifier accepted another key endorsement")
	}
}

func mustAK(t *testing.T, evidence []byte) []byte {
	t.Helper()
	ev := &attestationv1.ConfidentialVMEvidence{}
	if err := proto.Unmarshal(evidence, ev); err != nil {
		t.Fatal(err)
	}
	q, err := tpm.ParseEvidence(ev.GetVtpm())
	if err != nil {
		t.Fatal(err)
	}
	return q.GetAttestationKey()
}

// FuzzVerify feeds the verifier mutations of genuine SEV-SNP evidence: it
// must never panic, and whatever verifies carries the genuine user data.
func FuzzVerify(f *testing.F) {
	p := platforms(f)[0]
	a, err := cvm.NewCompositeAttester(p.attester(f, snpLaunch, false), vTPM(f))
	if err != nil {
		f.Fatal(err)
	}
	ev, err := a.Attest(context.Background(), tlsKeyHash, nonce)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ev)
	v := verifier(f, p, nil)
	f.Fuzz(func(t *testing.T, evidence []byte) {
		result, err := v.Verify(context.Background(), evidence, nonce)
		if err == nil && !bytes.Equal(result.UserData, tlsKeyHash) {
			t.Fatalf("evidence verified with user data %q", result.UserData)
		}
	})
}
