package snpguest

import (
	"os"
	"testing"
)

// TestNewMatchesThePlatform: inside an SEV-SNP guest (the device exists) New
// succeeds; anywhere else, as on CI, it fails instead of producing evidence.
func TestNewMatchesThePlatform(t *testing.T) {
	_, statErr := os.Stat("/dev/sev-guest")
	_, err := New()
	if inGuest := statErr == nil; inGuest != (err == nil) {
		t.Fatalf("SEV-SNP guest device present: %t, but New returned %v", inGuest, err)
	}
}
