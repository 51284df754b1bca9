package cli

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"
	pb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/cvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snpguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxtest"
)

// collateralLine is the generated configuration's collateral setting,
// which tests replace by their hierarchy's roots (it has no KDS or PCS).
var collateralLine = regexp.MustCompile(`(?m)^    collateral: \{.*\}$`)

// confidentialVM is a test confidential VM platform: the hardware
// attester of a VM that launched launch, and how a configuration trusts
// the platform's test roots.
type confidentialVM struct {
	variant  attestation.Variant
	hardware func(t *testing.T, launch []byte) attestation.Attester
	flags    func(launch []byte) []string
	// roots is the PEM of the platform's test roots; rootsList says the
	// section's roots field is a list (sevSnp) rather than one bundle (tdx).
	roots     string
	rootsList bool
}

func confidentialVMs(t *testing.T) []confidentialVM {
	tcb := kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}
	amd := snptest.NewAMD(t, snptest.Options{TCB: tcb})
	intel := tdxtest.NewIntel(t)
	return []confidentialVM{{
		variant: attestation.VariantSNP,
		hardware: func(t *testing.T, launch []byte) attestation.Attester {
			a, err := snpguest.NewWithProvider(amd.Device(t, snptest.Report{Measurement: launch}))
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		flags: func(launch []byte) []string {
			return []string{"--attestation", "sev-snp", "--launch-measurement", hex.EncodeToString(launch), "--snp-minimum-tcb", "3.0.8.115"}
		},
		roots: amd.CertChainPEM(), rootsList: true,
	}, {
		variant: attestation.VariantTDX,
		hardware: func(t *testing.T, launch []byte) attestation.Attester {
			a, err := tdxguest.NewWithProvider(intel.Device(t, func(b *pb.TDQuoteBody) { b.MrTd = launch }))
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		flags: func(launch []byte) []string {
			return []string{"--attestation", "tdx", "--mrtd", hex.EncodeToString(launch)}
		},
		roots: intel.RootPEM(),
	}}
}

// startConfidentialVM serves a node whose evidence is the simulator vTPM's
// quote with hw's report binding its key; config trusts p's test roots.
func startConfidentialVM(t *testing.T, p confidentialVM, hw attestation.Attester, launch []byte) *node {
	t.Helper()
	sim, vtpm := bootSimulator(t)
	node, err := cvm.NewCompositeAttester(hw, vtpm)
	if err != nil {
		t.Fatal(err)
	}
	n := startNodeAs(t, sim, vtpm, node)
	n.hardware = p.flags(launch)
	value, err := json.Marshal(p.roots) // a JSON string is a YAML string
	if err != nil {
		t.Fatal(err)
	}
	if p.rootsList {
		value = append(append([]byte{'['}, value...), ']')
	}
	n.patch = func(config string) string {
		return collateralLine.ReplaceAllString(config, "    roots: "+string(value))
	}
	return n
}

// TestInitAndVerifyConfidentialVM: for sev-snp and tdx, init verifies a
// confidential VM against the configuration's hardware section and vTPM
// PCRs and initialises it, and verify reports the hardware; a VM that
// launched another image is refused by init before anything is sent.
func TestInitAndVerifyConfidentialVM(t *testing.T) {
	launch, other := bytes.Repeat([]byte{0xaa}, 48), bytes.Repeat([]byte{0xcc}, 48)
	for _, p := range confidentialVMs(t) {
		// Each node takes the process's one simulator, so each runs in
		// its own subtest, whose cleanup frees it.
		t.Run(string(p.variant)+"/another image", func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			n := startConfidentialVM(t, p, p.hardware(t, other), launch)
			config := writeConfig(t, dir, n, false)
			if err := os.WriteFile("secret", []byte(n.secret+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := runErr(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret")
			if err == nil || !strings.Contains(err.Error(), "did not prove it runs what the configuration expects") {
				t.Fatalf("init of a VM that launched another image: %v\n%s", err, out)
			}
			if n.lock.Locked() || len(n.kubeadm.calls) != 0 {
				t.Fatal("a VM that launched another image was initialised")
			}
		})
		t.Run(string(p.variant)+"/genuine", func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			n := startConfidentialVM(t, p, p.hardware(t, launch), launch)
			config := writeConfig(t, dir, n, false)
			if err := os.WriteFile("secret", []byte(n.secret+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if out := run(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret"); !strings.Contains(out, "is initialised") {
				t.Fatalf("init output:\n%s", out)
			}
			out := run(t, "verify", "--config", config, "--node", n.evidence, "--output", "json")
			var report struct {
				Variant     string   `json:"variant"`
				Endorsement string   `json:"endorsement"`
				Identity    string   `json:"identity"`
				Identities  []string `json:"identities"`
			}
			if err := json.Unmarshal([]byte(out), &report); err != nil || report.Variant != string(p.variant) || !strings.HasPrefix(report.Endorsement, string(p.variant)+" ") ||
				!strings.Contains(report.Endorsement, hex.EncodeToString(launch)) {
				t.Fatalf("verify report %s (%v): want the %s hardware and its measurement named", out, err, p.variant)
			}
			// The vTPM's key and the host, each a deny-list entry.
			hostPrefix := map[attestation.Variant]string{attestation.VariantSNP: "sev-snp-chip:", attestation.VariantTDX: "tdx-ppid:"}[p.variant]
			if len(report.Identities) != 2 || report.Identities[0] != report.Identity || !strings.HasPrefix(report.Identities[1], hostPrefix) {
				t.Fatalf("verify report's identities %q, want the AK and the %s host", report.Identities, p.variant)
			}
		})
	}
}

// TestReferenceValuesCaptureConfidentialVM: from a golden confidential VM
// of each variant, capture writes the PCR files and the hardware section
// with the launch measurement or MRTD it measured, which config generate
// takes; a golden VM whose hardware chains to roots capture was not told
// to trust is refused and nothing is written.
func TestReferenceValuesCaptureConfidentialVM(t *testing.T) {
	launch := bytes.Repeat([]byte{0xab}, 48)
	for _, p := range confidentialVMs(t) {
		t.Run(string(p.variant), func(t *testing.T) {
			dir := t.TempDir()
			n := startConfidentialVM(t, p, p.hardware(t, launch), launch)
			roots := filepath.Join(dir, "roots.pem")
			if err := os.WriteFile(roots, []byte(p.roots), 0o600); err != nil {
				t.Fatal(err)
			}
			untrusted := filepath.Join(dir, "untrusted")
			if err := os.Mkdir(untrusted, 0o700); err != nil {
				t.Fatal(err)
			}
			if out, err := runErr(t, "reference-values", "capture", "--attestation", string(p.variant), "--control-plane", n.evidence,
				"--pcrs", "0,4,8,15", "--output-dir", untrusted); err == nil {
				t.Fatalf("capture from a VM of a test hierarchy, trusting the vendor's real roots, succeeded:\n%s", out)
			}
			if entries, _ := os.ReadDir(untrusted); len(entries) != 0 {
				t.Fatalf("a refused capture wrote %d files", len(entries))
			}

			out := run(t, "reference-values", "capture", "--attestation", string(p.variant), "--control-plane", n.evidence,
				"--hardware-roots", roots, "--pcrs", "0,4,8,15", "--output-dir", dir)
			section := map[attestation.Variant]string{attestation.VariantSNP: "sev-snp.yaml", attestation.VariantTDX: "tdx.yaml"}[p.variant]
			data, err := os.ReadFile(filepath.Join(dir, section))
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !strings.Contains(string(data), hex.EncodeToString(launch)) || !strings.Contains(string(data), "fresh evidence from "+n.evidence) {
				t.Fatalf("%s does not hold the measured launch value and its source:\n%s", section, data)
			}
			flags := p.flags(launch)
			run(t, append([]string{"config", "generate", "--output", filepath.Join(dir, "config.yaml"), "--pcrs", "0,4,8,15",
				"--reference-values", filepath.Join(dir, "reference-values.yaml"),
				"--control-plane-reference-values", filepath.Join(dir, "control-plane.yaml")}, flags...)...)
		})
	}
}

// TestHardwareSection: every distinct SEV-SNP launch measurement is
// listed with the roles that measured it; TDX roles with different MRTDs
// are refused (a tdx policy names one MRTD), and RTMRs go in only where
// every role agrees.
func TestHardwareSection(t *testing.T) {
	m := func(b byte) []byte { return bytes.Repeat([]byte{b}, 48) }
	role := func(r policy.Role, measured map[uint32][]byte) captured {
		return captured{role: r, provenance: "test", hardware: &attestation.Result{Measurements: measured, Endorsement: "hw"}}
	}
	_, data, err := hardwareSection(attestation.VariantSNP, []captured{
		role(policy.RoleControlPlane, map[uint32][]byte{0: m(1)}), role(policy.RoleWorker, map[uint32][]byte{0: m(2)}),
	}, time.Now())
	if err != nil || !strings.Contains(string(data), hex.EncodeToString(m(1))+"\" # controlPlane") || !strings.Contains(string(data), hex.EncodeToString(m(2))+"\" # worker") {
		t.Fatalf("sev-snp section (%v):\n%s", err, data)
	}
	if _, _, err := hardwareSection(attestation.VariantTDX, []captured{
		role(policy.RoleControlPlane, map[uint32][]byte{0: m(1)}), role(policy.RoleWorker, map[uint32][]byte{0: m(2)}),
	}, time.Now()); err == nil || !strings.Contains(err.Error(), "MRTDs differ") {
		t.Fatalf("tdx roles with different MRTDs: %v", err)
	}
	_, data, err = hardwareSection(attestation.VariantTDX, []captured{
		role(policy.RoleControlPlane, map[uint32][]byte{0: m(1), 1: m(3), 2: m(4)}), role(policy.RoleWorker, map[uint32][]byte{0: m(1), 1: m(3), 2: m(5)}),
	}, time.Now())
	if err != nil || !strings.Contains(string(data), "0: \""+hex.EncodeToString(m(3))) || strings.Contains(string(data), hex.EncodeToString(m(4))) {
		t.Fatalf("tdx section (%v):\n%s", err, data)
	}
}
