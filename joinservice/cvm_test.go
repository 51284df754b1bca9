package joinservice

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-sev-guest/kds"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"google.golang.org/grpc/codes"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/cvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snpguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxtest"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// keyBinding is an attester whose hardware report binds another vTPM's
// key than the one signing its quote: a host replaying one VM's report
// with its own vTPM.
type keyBinding struct {
	vtpm, hardware attestation.Attester
}

func (k keyBinding) Variant() attestation.Variant { return k.hardware.Variant() }

func (k keyBinding) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	bound := keyBindingAttester{hardware: k.hardware}
	a, err := cvm.NewCompositeAttester(bound, k.vtpm)
	if err != nil {
		return nil, err
	}
	return a.Attest(ctx, userData, nonce)
}

// keyBindingAttester asks the hardware to bind other bytes than the AK.
type keyBindingAttester struct{ hardware attestation.Attester }

func (b keyBindingAttester) Variant() attestation.Variant { return b.hardware.Variant() }

func (b keyBindingAttester) Attest(ctx context.Context, _, nonce []byte) ([]byte, error) {
	return b.hardware.Attest(ctx, []byte("the TPMT_PUBLIC of another VM's vTPM key"), nonce)
}

// cvmRefusal is a confidential VM the join service must refuse: its hardware
// attester (nil: a report binding another vTPM's key) and the audit reason.
type cvmRefusal struct {
	name     string
	hardware func(t *testing.T) attestation.Attester
	reason   string
}

// TestConfidentialVMJoin: with a sev-snp or tdx join policy, a node whose
// vTPM quote comes with a hardware report from go-sev-guest's test device
// (or the test TDX hierarchy) binding its vTPM key joins over attested TLS
// with no registered key, its audit entry naming the hardware; a
// debuggable guest, another launch measurement, a TCB below the minimum
// and a report binding another key are refused in the handshake with
// their reasons, and nothing is issued.
func TestConfidentialVMJoin(t *testing.T) {
	testenv.RequireRoot(t)
	tcb := kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}
	launch := bytes.Repeat([]byte{0xaa}, 48)
	other := bytes.Repeat([]byte{0xcc}, 48)
	amd := snptest.NewAMD(t, snptest.Options{TCB: tcb})
	lowTCB := tcb
	lowTCB.SnpSpl = 7
	// The same test-only AMD keys, with a VCEK for a TCB below the minimum.
	outdated := snptest.NewAMD(t, snptest.Options{TCB: lowTCB})
	intel := tdxtest.NewIntel(t)
	snpNode := func(t *testing.T, r snptest.Report) attestation.Attester {
		a, err := snpguest.NewWithProvider(amd.Device(t, r))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	tdxNode := func(t *testing.T, mrtd []byte, debug bool) attestation.Attester {
		a, err := tdxguest.NewWithProvider(intel.Device(t, func(b *pb.TDQuoteBody) {
			b.MrTd = mrtd
			if debug {
				b.TdAttributes[0] |= 1
			}
		}))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tt := range []struct {
		variant  attestation.Variant
		hardware map[string]any
		genuine  func(t *testing.T) attestation.Attester
		refused  []cvmRefusal
	}{{
		variant: attestation.VariantSNP,
		hardware: map[string]any{"sevSnp": map[string]any{
			"launchMeasurements": []string{hex.EncodeToString(launch)},
			"minimumTCB":         map[string]any{"bootloader": 3, "snp": 8, "microcode": 115},
			"roots":              []string{amd.CertChainPEM()},
		}},
		genuine: func(t *testing.T) attestation.Attester { return snpNode(t, snptest.Report{Measurement: launch}) },
		refused: []cvmRefusal{
			{"debuggable guest", func(t *testing.T) attestation.Attester {
				return snpNode(t, snptest.Report{Measurement: launch, Debug: true})
			}, "evidence_policy"},
			{"other launch measurement", func(t *testing.T) attestation.Attester { return snpNode(t, snptest.Report{Measurement: other}) }, "measurement_mismatch"},
			{"TCB below the minimum", func(t *testing.T) attestation.Attester {
				a, err := snpguest.NewWithProvider(outdated.Device(t, snptest.Report{Measurement: launch}))
				if err != nil {
					t.Fatal(err)
				}
				return a
			}, "evidence_policy"},
		},
	}, {
		variant: attestation.VariantTDX,
		hardware: map[string]any{"tdx": map[string]any{
			"mrtd":  hex.EncodeToString(launch),
			"roots": intel.RootPEM(),
		}},
		genuine: func(t *testing.T) attestation.Attester { return tdxNode(t, launch, false) },
		refused: []cvmRefusal{
			{"debuggable TD", func(t *testing.T) attestation.Attester { return tdxNode(t, launch, true) }, "evidence_policy"},
			{"other MRTD", func(t *testing.T) attestation.Attester { return tdxNode(t, other, false) }, "measurement_mismatch"},
		},
	}} {
		t.Run(string(tt.variant), func(t *testing.T) {
			h := newHarness(t, harnessOptions{variant: tt.variant, hardware: tt.hardware})
			ctx := t.Context()
			node, err := cvm.NewCompositeAttester(tt.genuine(t), h.node.attester)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := h.dial(t, node, "").IssueJoinTicket(ctx, joinRequest(t, "cvm-worker", net.IPv4(10, 0, 0, 31), false))
			if err != nil {
				t.Fatalf("a confidential VM with genuine evidence and no registered key: %v", err)
			}
			h.checkTicket(t, resp, "cvm-worker")
			if !slices.ContainsFunc(h.auditEntries(t), func(e auditEntry) bool {
				return e.Node == "cvm-worker" && strings.HasPrefix(e.Evidence.Endorsement, string(tt.variant)+" ")
			}) {
				t.Errorf("the allowed join's audit entry does not name the hardware:\n%s", h.logs.String())
			}
			for _, r := range append(slices.Clone(tt.refused), cvmRefusal{"report binds another vTPM's key", nil, "untrusted_key"}) {
				t.Run(r.name, func(t *testing.T) {
					var attester attestation.Attester
					if r.hardware == nil {
						attester = keyBinding{vtpm: h.node.attester, hardware: tt.genuine(t)}
					} else if attester, err = cvm.NewCompositeAttester(r.hardware(t), h.node.attester); err != nil {
						t.Fatal(err)
					}
					before := h.snapshot(t)
					_, err := h.dial(t, attester, "").IssueJoinTicket(ctx, joinRequest(t, "intruder", net.IPv4(10, 0, 0, 32), false))
					h.refused(t, err, codes.Unavailable, "handshake", r.reason)
					h.assertNothingIssued(t, before)
				})
			}
			h.assertNoSecretsLogged(t, resp)
		})
	}
}
