package snpguest

import (
	"os"
	"testing"
)

// TestNewMatchesThePlatform: inside an SEV-SNP guest (the device exists) New
// succeeds; anywhere else, as on CI, it fails instead of producing evidence,
// through either interface.
func TestNewMatchesThePlatform(t *testing.T) {
	_, statErr := os.Stat("/dev/sev-guest")
	_, err := New(Auto)
	if inGuest := statErr == nil; inGuest != (err == nil) {
		t.Fatalf("SEV-SNP guest device present: %t, but New returned %v", inGuest, err)
	}
	if statErr != nil {
		for _, iface := range []Interface{configFSTSM, sevGuest} {
			if _, err := New(iface); err == nil {
				t.Errorf("New(%s) succeeded outside an SEV-SNP guest", iface)
			}
		}
	}
	if _, err := ParseInterface("tpm"); err == nil {
		t.Error("ParseInterface accepted an unknown interface")
	}
}
