package tdxguest

import (
	"os"
	"testing"
)

// TestNewMatchesThePlatform: inside a TDX guest (configfs-tsm offers a TDX
// report) New succeeds; anywhere else, as on CI, it fails instead of
// producing evidence.
func TestNewMatchesThePlatform(t *testing.T) {
	_, statErr := os.Stat("/sys/kernel/config/tsm/report")
	_, tdxDev := os.Stat("/dev/tdx_guest")
	inGuest := statErr == nil && tdxDev == nil
	_, err := New()
	if inGuest != (err == nil) {
		t.Fatalf("TDX guest interfaces present: %t, but New returned %v", inGuest, err)
	}
}
