package build

import (
	"strings"
	"testing"
)

// FuzzReleaseDate feeds releaseDate what a mirror could serve as a Release
// file: it never panics, and a date it returns is after 1970 and found
// again in the same file.
func FuzzReleaseDate(f *testing.F) {
	f.Add([]byte("Origin: Debian\nSuite: oldstable\nDate: Sat, 11 Jul 2026 10:16:37 UTC\n"))
	f.Add([]byte("-----BEGIN PGP SIGNED MESSAGE-----\nDate: Thu, 01 Jan 1970 00:00:00 UTC\n"))
	f.Add([]byte("Date: yesterday\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := releaseDate(data)
		if err != nil {
			return
		}
		if got < 0 {
			t.Fatalf("negative date %d", got)
		}
		if got > 0 && !strings.Contains(string(data), "Date: ") {
			t.Fatalf("date %d from a file without a Date field", got)
		}
		if again, err := releaseDate(data); err != nil || again != got {
			t.Fatalf("a second parse gave %d, %v; the first %d", again, err, got)
		}
	})
}
