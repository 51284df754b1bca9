package snpguest

import (
	"os"
	"testing"
)

// TestNewOutsideAGuest checks the only path this machine can run: outside an
// SEV-SNP guest, New fails instead of producing evidence.
func TestNewOutsideAGuest(t *testing.T) {
	if _, err := os.Stat("/dev/sev-guest"); err == nil {
		t.Skip("this machine is an SEV-SNP guest; the error path cannot be shown here")
	}
	if _, err := New(); err == nil {
		t.Fatal("New succeeded outside an SEV-SNP guest")
	}
}
