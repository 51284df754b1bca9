package choose

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// TestEveryVariantIsRegistered: a variant the evidence format knows (it has
// an OID) has an attester and a verifier here, and nothing else does.
func TestEveryVariantIsRegistered(t *testing.T) {
	for _, arc := range []int{1, 2, 3, 4, 5, 6, 7, 8} {
		v, known := attestation.VariantForOID(append(evidenceArc(t), arc))
		_, registered := variants[v]
		if known != registered {
			t.Errorf("variant %q (arc %d): known to the evidence format %v, registered %v", v, arc, known, registered)
		}
	}
	for v := range variants {
		if _, err := attestation.ParseVariant(string(v)); err != nil {
			t.Errorf("registered variant %q is unknown to the evidence format: %v", v, err)
		}
	}
}

func evidenceArc(t *testing.T) []int {
	t.Helper()
	oid, err := attestation.VariantTPM.OID()
	if err != nil {
		t.Fatal(err)
	}
	return oid[:len(oid)-1]
}

// TestVerifierRefusesWhatTheVariantDoesNotTake: each variant names the
// policy field that does not fit it.
func TestVerifierRefusesWhatTheVariantDoesNotTake(t *testing.T) {
	pcrs := []int{0, keys.NodeLockPCR}
	tests := []struct {
		name    string
		variant attestation.Variant
		a       Appraisal
		want    string
	}{
		{"tpm with a hardware section", attestation.VariantTPM, Appraisal{SEVSNP: &SEVSNPPolicy{}}, "variant tpm takes no sevSnp or tdx section"},
		{"sev-snp with key trust", attestation.VariantSNP, Appraisal{EndorsementSet: true, SEVSNP: &SEVSNPPolicy{}}, "remove pinnedAKs"},
		{"sev-snp with a tdx section", attestation.VariantSNP, Appraisal{TDX: &TDXPolicy{}}, "not tdx"},
		{"sev-snp without its section", attestation.VariantSNP, Appraisal{}, "needs a sevSnp section"},
		{"tdx without its section", attestation.VariantTDX, Appraisal{}, "needs a tdx section"},
		{"tdx with a sev-snp section", attestation.VariantTDX, Appraisal{SEVSNP: &SEVSNPPolicy{}}, "not sevSnp"},
		{"azure-sev-snp with key trust", attestation.VariantAzureSNP, Appraisal{EndorsementSet: true, SEVSNP: &SEVSNPPolicy{}}, "remove pinnedAKs"},
		{"azure-sev-snp without its section", attestation.VariantAzureSNP, Appraisal{}, "needs a sevSnp section"},
		{"azure-sev-snp with a tdx section", attestation.VariantAzureSNP, Appraisal{TDX: &TDXPolicy{}}, "not tdx"},
		{"azure-sev-snp from another VMPL than the paravisor's", attestation.VariantAzureSNP, Appraisal{SEVSNP: &SEVSNPPolicy{LaunchMeasurements: []string{strings.Repeat("aa", 48)}, VMPL: ptr(2)}}, "VMPL 0"},
		{"unknown variant", attestation.Variant("sgx"), Appraisal{}, `"sgx" has no attester and verifier`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.a.PCRs, tt.a.Now = pcrs, time.Now
			if _, err := Verifier(tt.variant, tt.a); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Verifier = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestOpenAttesterNamesTheFlag: bad options are refused before the TPM is
// opened, naming the bootstrapper flag.
func TestOpenAttesterNamesTheFlag(t *testing.T) {
	for _, tt := range []struct {
		o    AttesterOptions
		want string
	}{
		{AttesterOptions{Variant: "sgx"}, "--attestation"},
		{AttesterOptions{Variant: "tpm", EKCertificate: "sometimes"}, "--ek-certificate"},
		{AttesterOptions{Variant: "sev-snp", EKCertificate: "auto", SNPInterface: "carrier-pigeon"}, "--sev-snp-interface"},
		{AttesterOptions{Variant: "azure-sev-snp", EKCertificate: "auto", AttestationKey: "owner"}, "--attestation-key owner"},
		{AttesterOptions{Variant: "tpm", EKCertificate: "auto", TCGEventLog: filepath.Join(t.TempDir(), "a-file", "log")}, ""},
	} {
		if strings.HasSuffix(tt.o.TCGEventLog, "log") {
			// A path through a file: neither readable nor absent.
			if err := os.WriteFile(filepath.Dir(tt.o.TCGEventLog), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			tt.want = "--tcg-event-log"
		}
		if _, err := OpenAttester(tt.o); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("OpenAttester(%+v) = %v, want an error naming %s", tt.o, err, tt.want)
		}
	}
}

// TestTCGEventLogPath: a log file that does not exist means no log (a
// machine whose firmware keeps none), one that does is read.
func TestTCGEventLogPath(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "binary_bios_measurements")
	if err := os.WriteFile(present, []byte("log"), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"": "", filepath.Join(dir, "absent"): "", present: present} {
		if got, err := tcgEventLogPath(path); err != nil || got != want {
			t.Errorf("tcgEventLogPath(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }
