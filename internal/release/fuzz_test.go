package release

import (
	"path/filepath"
	"testing"
)

// FuzzParseChecksums: SHA256SUMS comes with a downloaded release. Whatever
// it holds, parsing never panics, and every path it accepts is local to
// the release and clean, with a 64-digit hex sum.
func FuzzParseChecksums(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef  bin/linux-amd64/gatehouse\n"))
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef  ../etc/passwd\n"))
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef  a/./b\n"))
	f.Add([]byte("zz  a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sums, err := parseChecksums(data)
		if err != nil {
			return
		}
		for name, sum := range sums {
			if !filepath.IsLocal(name) || filepath.Clean(name) != name {
				t.Fatalf("accepted %q, a path outside the release or not clean", name)
			}
			if len(sum) != 64 {
				t.Fatalf("accepted the sum %q for %s", sum, name)
			}
		}
	})
}
