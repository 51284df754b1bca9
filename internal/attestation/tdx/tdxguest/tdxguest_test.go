package tdxguest

import (
	"os"
	"testing"
)

// TestNewOutsideAGuest checks the only path this machine can run: outside a
// TDX guest, New fails instead of producing evidence.
func TestNewOutsideAGuest(t *testing.T) {
	for _, dev := range []string{"/dev/tdx_guest", "/dev/tdx-guest"} {
		if _, err := os.Stat(dev); err == nil {
			t.Skip("this machine is a TDX guest; the error path cannot be shown here")
		}
	}
	if _, err := New(); err == nil {
		t.Fatal("New succeeded outside a TDX guest")
	}
}
