package snp

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
)

// TestChipIdentityWhenTheHostMasksCHIPID: a report names its chip by
// CHIP_ID; a host that masks CHIP_ID (zeros) cannot hide the chip, whose
// VCEK signed the report and names it (its HWID), so a deny-list entry for
// the chip still matches. A masked report signed by a VLEK, the cloud
// provider's key, names no chip, rather than the all-zero one that every
// masked report would share.
func TestChipIdentityWhenTheHostMasksCHIPID(t *testing.T) {
	chip := bytes.Repeat([]byte{0x5a}, abi.ChipIDSize)
	f := &fakeAMD{snptest.NewAMD(t, snptest.Options{TCB: testTCB, ChipID: chip})}
	want := "sev-snp-chip:" + hex.EncodeToString(chip)
	nonce := bytes.Repeat([]byte{7}, attestation.NonceSize)
	for _, tt := range []struct {
		name string
		mask bool
	}{{"CHIP_ID in the report", false}, {"CHIP_ID masked by the host", true}} {
		t.Run(tt.name, func(t *testing.T) {
			raw := f.Unsigned(t, snptest.Report{Measurement: testMeasurement, TCB: &testTCB, MaskChipID: tt.mask}, attestation.Binding512(nonce, nil))
			if got := raw[0x1a0 : 0x1a0+abi.ChipIDSize]; bytes.Equal(got, chip) == tt.mask {
				t.Fatalf("the report's CHIP_ID is %x, masked %t", got, tt.mask)
			}
			r, s, err := f.Signer.Sign(abi.SignedComponent(raw))
			if err != nil {
				t.Fatal(err)
			}
			if err := abi.SetSignature(r, s, raw); err != nil {
				t.Fatal(err)
			}
			chain := &spb.CertificateChain{ArkCert: f.Signer.Ark.Raw, AskCert: f.Signer.Ask.Raw, VcekCert: f.Signer.Vcek.Raw}
			ev, err := Evidence(raw, abi.CertsFromProto(chain).Marshal(), nil)
			if err != nil {
				t.Fatal(err)
			}
			result, err := f.verifier(t, nil).Verify(t.Context(), ev, nonce)
			if err != nil {
				t.Fatal(err)
			}
			if result.Identity != want {
				t.Fatalf("identity %q, want the chip's %q", result.Identity, want)
			}
		})
	}

	t.Run("CHIP_ID masked, signed by a VLEK", func(t *testing.T) {
		vlek := abi.ComposeSignerInfo(abi.SignerInfo{SigningKey: abi.VlekReportSigner})
		att := &spb.Attestation{
			Report:           &spb.Report{ChipId: make([]byte, abi.ChipIDSize), SignerInfo: vlek},
			CertificateChain: &spb.CertificateChain{VcekCert: f.Signer.Vcek.Raw},
		}
		if got := chipIdentity(att); got != "" {
			t.Fatalf("identity %q, want none", got)
		}
	})
}
