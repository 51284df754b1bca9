package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReleaseKeygenAndVerifyArguments(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "release.key"), filepath.Join(dir, "release.pub")
	run := func(args ...string) (string, error) {
		cmd := NewRootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("release", "keygen", "--private-key", priv, "--public-key", pub)
	if err != nil {
		t.Fatalf("keygen: %v: %s", err, out)
	}
	if strings.Contains(out, "PRIVATE KEY") { // the PEM's label: no key is printed
		t.Errorf("keygen printed the private key: %s", out)
	}
	if fi, err := os.Stat(priv); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("private key file: %v, mode %v; want 0600", err, fi.Mode())
	}
	privPEM, err := os.ReadFile(priv)
	if err != nil {
		t.Fatal(err)
	}
	keyBody := strings.Split(string(privPEM), "\n")[1] // the base64 of the key
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"keygen never overwrites a key", []string{"release", "keygen", "--private-key", priv, "--public-key", pub}, "an existing key is never overwritten"},
		{"the private key is not a public key", []string{"release", "verify", dir, "--key", priv}, "release key " + priv},
		{"a missing key file is named", []string{"release", "verify", dir, "--key", filepath.Join(dir, "nope.pub")}, "reading the release key"},
		{"a directory that is no release is refused naming SHA256SUMS", []string{"release", "verify", dir, "--key", pub}, "release refused: SHA256SUMS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := run(tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("%v = %v (%s), want an error containing %q", tt.args, err, out, tt.wantErr)
			}
			if strings.Contains(err.Error(), keyBody) {
				t.Errorf("the error holds key material: %v", err)
			}
		})
	}
}
