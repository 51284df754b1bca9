// Package kmstest provides real key-management backends for tests: a
// SoftHSM2 token with a key-encryption key.
package kmstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ThalesGroup/crypto11"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

// SoftHSMModule is the Debian softhsm2 package's PKCS#11 library.
const SoftHSMModule = "/usr/lib/softhsm/libsofthsm2.so"

// NewSoftHSM creates a SoftHSM2 token with an AES-256 KEK in a fresh
// directory and returns the URI naming it.
func NewSoftHSM(t *testing.T) *kms.PKCS11URI {
	t.Helper()
	if _, err := os.Stat(SoftHSMModule); err != nil {
		t.Fatalf("SoftHSM2 is not installed (%v): install the Debian package softhsm2 (make setup-test does)", err)
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	if err := os.WriteFile(conf, []byte("directories.tokendir = "+tokens+"\nobjectstore.backend = file\nlog.level = ERROR\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SOFTHSM2_CONF", conf)
	pinFile := filepath.Join(dir, "pin")
	if err := os.WriteFile(pinFile, []byte("1234\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("softhsm2-util", "--init-token", "--free", "--label", "gatehouse", "--pin", "1234", "--so-pin", "5678").CombinedOutput(); err != nil {
		t.Fatalf("softhsm2-util --init-token: %v\n%s", err, out)
	}
	ctx, err := crypto11.Configure(&crypto11.Config{Path: SoftHSMModule, TokenLabel: "gatehouse", Pin: "1234"})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if _, err := ctx.GenerateSecretKeyWithLabel([]byte{1}, []byte("kek"), 256, crypto11.CipherAES); err != nil {
		t.Fatalf("generating KEK: %v", err)
	}
	return &kms.PKCS11URI{Module: SoftHSMModule, Token: "gatehouse", PinSource: "file:" + pinFile, KeyLabel: "kek"}
}
