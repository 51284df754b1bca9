package cli

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// TestVerifyPrintsTheEvents: the PCR table counts each PCR's events, and
// --events lists them; evidence without a log says so.
func TestVerifyPrintsTheEvents(t *testing.T) {
	digest := bytes.Repeat([]byte{0xab}, 32)
	result := &attestation.Result{
		Measurements: map[uint32][]byte{4: digest, 11: digest, 15: make([]byte, 32)},
		BootEvents: []attestation.BootEvent{
			{Number: 1, PCR: 4, Type: "EV_EFI_ACTION", Description: "Calling EFI Application from Boot Option", Digest: digest},
			{Number: 9, PCR: 11, Type: "EV_IPL", Description: ".cmdline", Digest: digest},
		},
	}
	tests := []struct {
		name   string
		result *attestation.Result
		events bool
		want   []string
	}{
		{"a summary by default", result, false, []string{"PCR  VALUE", "EVENTS", "11   " + fmt.Sprintf("%x", digest) + "  1", "2 events (--events lists them)"}},
		{"the events with --events", result, true, []string{"PCR  EVENT  TYPE", "11   9      EV_IPL         .cmdline", fmt.Sprintf("%x", digest)}},
		{"no log", &attestation.Result{Measurements: result.Measurements}, true, []string{"4    " + fmt.Sprintf("%x", digest) + "  -", "carries no TCG event log"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printVerifyReport(&out, verifyReport{Node: "n"}, tt.result, tt.events); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// TestRefusalListsTheEvents: a refusal's events stand one per line, and
// the error still wraps the verifier's.
func TestRefusalListsTheEvents(t *testing.T) {
	ref := measurements.M{
		4:  {Expected: make([]byte, 32), Events: []measurements.Event{{Type: "EV_EFI_ACTION", Digest: make([]byte, 32)}}},
		11: {Expected: make([]byte, 32), Events: []measurements.Event{{Type: "EV_IPL", Description: ".cmdline", Digest: make([]byte, 32), Source: "uki.efi section .cmdline"}}},
	}
	measured := map[uint32][]byte{4: bytes.Repeat([]byte{1}, 32), 11: bytes.Repeat([]byte{1}, 32)}
	events := []attestation.BootEvent{
		{Number: 1, PCR: 4, Type: "EV_EFI_ACTION", Digest: bytes.Repeat([]byte{2}, 32)},
		{Number: 9, PCR: 11, Type: "EV_IPL", Description: ".cmdline", Digest: bytes.Repeat([]byte{3}, 32)},
	}
	inner := fmt.Errorf("%w: role worker: index 11 differs%s; role controlPlane: index 4 differs", attestation.ErrMeasurement,
		tpm.ExplanationSuffix(tpm.ExplainMismatches(ref, measured, events)))
	err := refusalError{fmt.Errorf("node n does not verify: %w", inner)}
	want := "node n does not verify: measurements do not match the reference values: role worker: index 11 differs\n" +
		"  the TCG event log shows:\n" +
		"    PCR 4: event 1 EV_EFI_ACTION \"\": digest 0202020202020202… expected 0000000000000000…\n" +
		"    PCR 11: event 9 EV_IPL \".cmdline\": digest 0303030303030303… expected 0000000000000000… (uki.efi section .cmdline)\n" +
		"role controlPlane: index 4 differs"
	if err.Error() != want || !errors.Is(err, attestation.ErrMeasurement) {
		t.Fatalf("refusal:\n%s\nwant:\n%s", err, want)
	}
}
