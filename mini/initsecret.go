package mini

import (
	"encoding/hex"
	"os"
	"path/filepath"

	"golang.org/x/crypto/bcrypt"
)

// initSecretFiles creates the init secret and its bcrypt hash, which the
// nodes are provisioned with.
func initSecretFiles(dir string) (secretFile, hashFile string, err error) {
	secret := make([]byte, 32)
	if _, err := randRead(secret); err != nil {
		return "", "", err
	}
	text := hex.EncodeToString(secret)
	hash, err := bcrypt.GenerateFromPassword([]byte(text), bcrypt.DefaultCost)
	if err != nil {
		return "", "", err
	}
	secretFile, hashFile = filepath.Join(dir, "init-secret"), filepath.Join(dir, "init-secret.bcrypt")
	if err := os.WriteFile(secretFile, []byte(text), 0o600); err != nil {
		return "", "", err
	}
	return secretFile, hashFile, os.WriteFile(hashFile, hash, 0o600)
}

// initSecret is the init secret's file, which the CLI sends, and its
// bcrypt hash's, which the first control plane is given.
type initSecret struct{ file, hashFile string }
