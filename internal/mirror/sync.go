package mirror

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gatehouse-dev/gatehouse/internal/components"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// errDigestMismatch means a file or image differs from its pinned digest.
var errDigestMismatch = errors.New("does not match its pinned digest")

// File is one file a mirror serves: its official URL and pinned
// "sha256:" digest.
type File struct {
	URL, Hash string
}

// Path returns where the file of original (an http(s) URL) lies under a
// mirror's root, slash-separated: <host>/<path>. The path is clean and
// relative: a URL whose path would leave the root is refused.
func Path(original string) (string, error) {
	u, err := url.Parse(original)
	if err != nil {
		return "", fmt.Errorf("mirroring %q: %w", original, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return "", fmt.Errorf("mirroring %q: only http(s) URLs with a host and no query have a mirror path", original)
	}
	p := u.Host + u.Path
	if clean := path.Clean(p); clean != p || strings.HasPrefix(clean, "..") || strings.HasSuffix(u.Path, "/") {
		return "", fmt.Errorf("mirroring %q: its path is not a clean file path", original)
	}
	return p, nil
}

// Files returns every file of release for archs (amd64, arm64), each
// once, in the table's order.
func Files(release versions.Release, archs []string) ([]File, error) {
	var out []File
	for _, arch := range archs {
		list, err := release.Components(arch)
		if err != nil {
			return nil, err
		}
		for _, c := range list {
			f := File{URL: c.URL, Hash: c.Hash}
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// SyncFiles downloads each file into dir at its Path (dir is then the
// file server's root), checking its sha256 before moving it into place:
// a download that differs is refused (errDigestMismatch, naming the URL,
// the pinned and the received digest) and leaves nothing. A file that is
// there already with its digest is kept. Progress goes to out, a line per
// file.
func SyncFiles(ctx context.Context, client *http.Client, dir string, files []File, out io.Writer) error {
	for i, f := range files {
		rel, err := Path(f.URL)
		if err != nil {
			return err
		}
		want, err := components.ParseHash(f.Hash)
		if err != nil {
			return fmt.Errorf("%s: %w", f.URL, err)
		}
		dest := filepath.Join(dir, filepath.FromSlash(rel))
		if got, err := fileDigest(dest); err == nil && string(got) == string(want) {
			fmt.Fprintf(out, "[%d/%d] %s: present, %s\n", i+1, len(files), rel, f.Hash)
			continue
		}
		fmt.Fprintf(out, "[%d/%d] %s: downloading %s\n", i+1, len(files), rel, f.URL)
		if err := download(ctx, client, f.URL, dest, want); err != nil {
			return err
		}
	}
	return nil
}

// download fetches rawURL into a temporary file beside dest and moves it
// to dest once its digest is want.
func download(ctx context.Context, client *http.Client, rawURL, dest string, want []byte) error {
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil { //nolint:gosec // a file server's tree: world-readable
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("downloading %s: %w", rawURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("downloading %s: HTTP %s", rawURL, resp.Status)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".gatehouse-mirror-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), resp.Body); err != nil {
		return fmt.Errorf("downloading %s: %w", rawURL, err)
	}
	if got := h.Sum(nil); string(got) != string(want) {
		return fmt.Errorf("%s %w: received sha256:%x, pinned sha256:%x", rawURL, errDigestMismatch, got, want)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dest)
}

func fileDigest(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// CopyImage copies image ref (a tag, or a digest that pins it) with every
// platform's content to the mirror's name for it (Image), and returns the
// mirror's name pinned by digest. The registry checks each blob's digest
// as it is pushed; CopyImage then reads the manifest back from the mirror
// and refuses (errDigestMismatch) one whose digest differs from the
// source's, or from ref's own digest when ref pins one. opts configure
// both registries (remote.WithContext is added).
func (m *Mirror) CopyImage(ctx context.Context, ref string, opts ...remote.Option) (string, error) {
	if m == nil || m.Registry == "" {
		return "", errors.New("copying images needs the mirror's registry")
	}
	src, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", ref, err)
	}
	mapped, err := m.Image(ref)
	if err != nil {
		return "", err
	}
	dst, err := name.ParseReference(mapped, name.Insecure)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", mapped, err)
	}
	opts = append(opts, remote.WithContext(ctx))
	desc, err := remote.Get(src, opts...)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", ref, err)
	}
	if d, ok := src.(name.Digest); ok && d.DigestStr() != desc.Digest.String() {
		return "", fmt.Errorf("image %s %w: its registry serves %s", ref, errDigestMismatch, desc.Digest)
	}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return "", err
		}
		err = remote.WriteIndex(dst, idx, opts...)
		if err != nil {
			return "", fmt.Errorf("pushing %s: %w", mapped, err)
		}
	} else {
		img, err := desc.Image()
		if err != nil {
			return "", err
		}
		if err := remote.Write(dst, img, opts...); err != nil {
			return "", fmt.Errorf("pushing %s: %w", mapped, err)
		}
	}
	got, err := remote.Head(dst, opts...)
	if err != nil {
		return "", fmt.Errorf("reading %s back: %w", mapped, err)
	}
	if got.Digest != desc.Digest {
		return "", fmt.Errorf("image %s on the mirror %w: it serves %s, the source %s", mapped, errDigestMismatch, got.Digest, desc.Digest)
	}
	return dst.Context().Name() + "@" + desc.Digest.String(), nil
}
