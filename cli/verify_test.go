package cli

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// TestVerify: before init the node verifies with PCR 15 zero; after init
// with the cluster ID from the state file; a stale expectation or a
// configuration the node does not match fails.
func TestVerify(t *testing.T) {
	n := startNode(t)
	dir := t.TempDir()
	t.Chdir(dir)
	config := writeConfig(t, dir, n, false)

	out := run(t, "verify", "--config", config, "--node", n.evidence)
	if !strings.Contains(out, "is verified") || !strings.Contains(out, "PCR 15 is zero") || !strings.Contains(out, "deny-list entries") ||
		!strings.Contains(out, "\n  tpm-ak:sha256:") {
		t.Fatalf("verify before init (want its identity as a deny-list entry):\n%s", out)
	}

	if err := os.WriteFile("secret", []byte(n.secret), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret")
	state, err := clusterconfig.ReadState(clusterconfig.DefaultStateFile)
	if err != nil {
		t.Fatal(err)
	}
	out = run(t, "verify", "--config", config, "--node", n.evidence, "--output", "json")
	var report verifyReport
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	id := state.ClusterID
	if report.ClusterID != id || report.Measurements["15"] == "" || !strings.HasPrefix(report.Identity, "tpm-ak:sha256:") ||
		!slices.Equal(report.Identities, []string{report.Identity}) ||
		!slices.Equal(report.Roles, []policy.Role{policy.RoleControlPlane}) {
		t.Fatalf("report %+v", report)
	}
	idBytes := mustHex(t, id)
	if report.Measurements["15"] != hexOf(keys.ExpectedNodeLockPCR(idBytes)) {
		t.Fatal("PCR 15 is not the cluster ID's value")
	}

	// Without the state file, PCR 15 is expected zero: the locked node fails.
	if err := os.Rename(clusterconfig.DefaultStateFile, "elsewhere.json"); err != nil {
		t.Fatal(err)
	}
	if out, err := runErr(t, "verify", "--config", config, "--node", n.evidence); err == nil || !strings.Contains(err.Error(), "index 15") {
		t.Fatalf("verify expecting an unlocked node: %v\n%s", err, out)
	}
	// A configuration the node does not match fails, naming the PCR.
	tampered := writeConfig(t, t.TempDir(), n, true)
	if out, err := runErr(t, "verify", "--config", tampered, "--node", n.evidence, "--state-file", "elsewhere.json"); err == nil || !strings.Contains(err.Error(), "does not verify") || !strings.Contains(err.Error(), "index 4") {
		t.Fatalf("verify against other reference values: %v\n%s", err, out)
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }
