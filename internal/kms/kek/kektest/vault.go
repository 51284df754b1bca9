package kektest

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	vault "github.com/hashicorp/vault/api"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

// VaultBinEnv names the environment variable holding the tests' Vault
// server (hack/vault-binary.sh builds it; make unit sets it).
const VaultBinEnv = "GATEHOUSE_VAULT_BIN"

// Vault is a real Vault server (a Vault core with the Transit engine at
// "transit", in memory) on a loopback port, for the test's lifetime.
type Vault struct {
	// Address is its URL, for VaultTransitURI.Address.
	Address string
	// Root is a client with the root token, for a test's administration.
	Root *vault.Client

	t         testing.TB
	unsealKey string
}

// NewVault starts a Vault server; it stops when the test ends.
func NewVault(t testing.TB) *Vault {
	t.Helper()
	bin := os.Getenv(VaultBinEnv)
	if bin == "" {
		t.Fatalf("%s is not set: run the tests with `make test`, or export %s=$(hack/vault-binary.sh)", VaultBinEnv, VaultBinEnv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-addr", "127.0.0.1:0") //nolint:gosec // the tests' own Vault build, named by GATEHOUSE_VAULT_BIN
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("vault log:\n%s", logs.String())
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("vault did not start: %v\n%s", err, logs.String())
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(line) {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	v := &Vault{Address: fields["VAULT_ADDR"], t: t, unsealKey: fields["VAULT_UNSEAL_KEY"]}
	if v.Root, err = vault.NewClient(&vault.Config{Address: v.Address}); err != nil {
		t.Fatal(err)
	}
	v.Root.SetToken(fields["VAULT_TOKEN"])
	return v
}

func (v *Vault) write(path string, data map[string]any) *vault.Secret {
	v.t.Helper()
	s, err := v.Root.Logical().Write(path, data)
	if err != nil {
		v.t.Fatalf("vault write %s: %v", path, err)
	}
	return s
}

// CreateKey creates the aes256-gcm96 Transit key name.
func (v *Vault) CreateKey(name string) {
	v.t.Helper()
	v.write("transit/keys/"+name, map[string]any{"type": "aes256-gcm96"})
}

// RotateKey adds a new version to Transit key name.
func (v *Vault) RotateKey(name string) {
	v.t.Helper()
	v.write("transit/keys/"+name+"/rotate", nil)
}

// SetMinDecryptionVersion retires versions of key name below version.
func (v *Vault) SetMinDecryptionVersion(name string, version int) {
	v.t.Helper()
	v.write("transit/keys/"+name+"/config", map[string]any{"min_decryption_version": version})
}

// TokenFile creates a token that may only encrypt, decrypt and rewrap with
// key name, writes it to a file and returns the token and the file.
func (v *Vault) TokenFile(name string) (token, file string) {
	v.t.Helper()
	policy := ""
	for _, op := range []string{"encrypt", "decrypt", "rewrap"} {
		policy += `path "transit/` + op + `/` + name + `" { capabilities = ["update"] }` + "\n"
	}
	v.write("sys/policies/acl/gatehouse-"+name, map[string]any{"policy": policy})
	s := v.write("auth/token/create", map[string]any{"policies": []string{"gatehouse-" + name}, "ttl": "1h"})
	token = s.Auth.ClientToken
	file = filepath.Join(v.t.TempDir(), "vault-token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		v.t.Fatal(err)
	}
	return token, file
}

// RevokeToken revokes token.
func (v *Vault) RevokeToken(token string) {
	v.t.Helper()
	v.write("auth/token/revoke", map[string]any{"token": token})
}

// Seal seals Vault: every request gets 503 until Unseal.
func (v *Vault) Seal() {
	v.t.Helper()
	if err := v.Root.Sys().Seal(); err != nil {
		v.t.Fatalf("sealing vault: %v", err)
	}
}

// Unseal unseals Vault with its unseal key.
func (v *Vault) Unseal() {
	v.t.Helper()
	if st, err := v.Root.Sys().Unseal(v.unsealKey); err != nil || st.Sealed {
		v.t.Fatalf("unsealing vault: %v", err)
	}
}

// URI returns the KEK URI of Transit key name with the token in file.
func (v *Vault) URI(name, tokenFile string) *kms.VaultTransitURI {
	return &kms.VaultTransitURI{Address: v.Address, Mount: "transit", Key: name, TokenSource: "file:" + tokenFile}
}
