package release

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
)

// listFiles returns the release's files, slash-separated relative paths,
// sorted: every regular file but signatures and SHA256SUMS.
func listFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if strings.HasSuffix(rel, cosignformat.SignatureSuffix) || rel == checksumsFile {
			return nil
		}
		files = append(files, rel)
		return nil
	})
	sort.Strings(files)
	return files, err
}

// checksums is SHA256SUMS of files (sha256sum's format: hex, two spaces,
// path).
func checksums(dir string, files []string) ([]byte, error) {
	var buf bytes.Buffer
	for _, f := range files {
		sum, err := fileSHA256(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&buf, "%s  %s\n", sum, f)
	}
	return buf.Bytes(), nil
}

// parseChecksums reads SHA256SUMS into path → hex sha256, refusing
// malformed lines, duplicates and paths leaving the release.
func parseChecksums(data []byte) (map[string]string, error) {
	sums := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if b, err := hex.DecodeString(sum); !ok || err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("line %d is not \"<sha256 hex>  <path>\"", n)
		}
		if !filepath.IsLocal(name) || name != filepath.ToSlash(filepath.Clean(name)) {
			return nil, fmt.Errorf("line %d names %q, not a path inside the release", n, name)
		}
		if _, dup := sums[name]; dup {
			return nil, fmt.Errorf("line %d lists %s again", n, name)
		}
		sums[name] = sum
	}
	return sums, sc.Err()
}

func sha256Hex(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// copyFile copies src to dst (mode 0644), creating dst's directory.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil { //nolint:gosec // a release is public
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644) //nolint:gosec // a release is public
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}
