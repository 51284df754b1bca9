package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpgradeApplyNodeValuesRefused: signed node values that do not
// verify are refused naming the file, before the cluster is read or
// anything changes (the kubeconfig does not even exist).
func TestUpgradeApplyNodeValuesRefused(t *testing.T) {
	b := buildSignedValues(t)
	run(t, "image", "sign-values", "--key", b.privKey, "--in", b.unsigned, "--out", b.signed, "--force")
	other := filepath.Join(t.TempDir(), "other.pub")
	run(t, "image", "keygen", "--private-key", filepath.Join(t.TempDir(), "other.key"), "--public-key", other)
	data, err := os.ReadFile(b.signed)
	if err != nil {
		t.Fatal(err)
	}
	tampered := filepath.Join(t.TempDir(), "tampered.signed.json")
	// One character of the base64 payload changed.
	i := strings.Index(string(data), `"payload":"`) + len(`"payload":"`) + 40
	changed := []byte(string(data))
	changed[i] ^= 0x01
	if err := os.WriteFile(tampered, changed, 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "absent.conf")
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no key", []string{"--node-values", b.signed}, "--node-values needs --node-values-key"},
		{"another key", []string{"--node-values", b.signed, "--node-values-key", other}, "--node-values " + b.signed + " (nothing was changed)"},
		{"a changed payload", []string{"--node-values", tampered, "--node-values-key", b.pubKey}, "--node-values " + tampered + " (nothing was changed)"},
		{"a key without values", []string{"--node-values-key", b.pubKey}, "--node-values-key without --node-values"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runErr(t, append([]string{"upgrade", "apply", "--kubeconfig", kubeconfig, "--backup-dir", t.TempDir()}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q\n%s", err, tt.wantErr, out)
			}
			if strings.Contains(err.Error(), kubeconfig) {
				t.Errorf("the refusal reached for the cluster: %v", err)
			}
		})
	}
}
