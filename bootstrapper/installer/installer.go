// Package installer installs the pinned Kubernetes components of a node
// (kubelet, kubeadm, kubectl, crictl, CNI plugins): each is downloaded,
// checked against its sha256 digest before anything is installed, and then
// moved into place atomically. Partial files never stay behind.
package installer

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/components"
)

// errHashMismatch means a download's digest differs from the pinned one.
// It is not retried: the source serves something else than was pinned.
var errHashMismatch = errors.New("downloaded file does not match its pinned sha256 digest")

// Options configure an Installer.
type Options struct {
	// Client downloads http(s) URLs; nil is a client with a 10-minute
	// timeout per download.
	Client *http.Client
	// Attempts per component for transient failures (network errors, HTTP
	// 5xx and 429, truncated bodies); 0 is 5.
	Attempts int
	// Backoff is the wait before the second attempt, doubled each time up
	// to 30 s; 0 is 1 s.
	Backoff time.Duration
	// Log receives one line per component; nil discards.
	Log *slog.Logger
}

// Installer downloads and installs components.
type Installer struct {
	opts Options
}

// New returns an installer.
func New(opts Options) *Installer {
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: 10 * time.Minute}
	}
	if opts.Attempts <= 0 {
		opts.Attempts = 5
	}
	if opts.Backoff <= 0 {
		opts.Backoff = time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Installer{opts: opts}
}

// Install installs every component in order, after validating them all. It
// stops at the first component that fails, leaving the ones before it
// installed and nothing of the failed one. A binary whose URL and digest
// an earlier component of the list had (one multi-call binary installed
// under several names) is copied from that one, which was checked, and
// not fetched again. A binary whose install path already
// holds the pinned digest (the node image's baked binaries, a link to one
// multi-call binary, on a read-only root) is left as it is.
func (i *Installer) Install(ctx context.Context, list []*componentsv1.Component) error {
	for _, c := range list {
		if err := components.Validate(c); err != nil {
			return err
		}
	}
	installed := map[string]string{} // URL and digest of a binary → where it was installed
	held := map[string]bool{}        // real file and digest that holds confirmed in this call
	for _, c := range list {
		key := c.GetUrl() + "\x00" + c.GetHash()
		var err error
		if !c.GetExtract() && holdsOnce(held, c.GetInstallPath(), c.GetHash()) {
			// The node image bakes the pinned binaries into its read-only
			// root (docs/image.md): nothing to fetch, nowhere to write.
			installed[key] = c.GetInstallPath()
			i.opts.Log.Info("Component already installed", "path", c.GetInstallPath(), "hash", c.GetHash())
			continue
		}
		if from, ok := installed[key]; ok && !c.GetExtract() {
			err = copyInstalled(from, c.GetInstallPath())
		} else {
			err = i.install(ctx, c)
		}
		if err != nil {
			return fmt.Errorf("installing %s: %w", c.GetInstallPath(), err)
		}
		if !c.GetExtract() {
			installed[key] = c.GetInstallPath()
		}
		i.opts.Log.Info("Installed component", "url", c.GetUrl(), "path", c.GetInstallPath(), "extract", c.GetExtract())
	}
	return nil
}

// holdsOnce is holds, hashing each real file (path with its links
// resolved) once per digest: the node image links the names of one
// multi-call binary (kubelet, kubeadm, kubectl) to one file of 156 MB,
// whose SHA-256 takes about 15 s under emulation. held remembers what
// was confirmed.
func holdsOnce(held map[string]bool, path, hash string) bool {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false
	}
	key := real + "\x00" + hash
	if held[key] {
		return true
	}
	if !holds(real, hash) {
		return false
	}
	held[key] = true
	return true
}

// holds reports whether the file at path (its target, if a link) has the
// pinned digest hash ("sha256:<hex>"); false when it cannot be read.
func holds(path, hash string) bool {
	want, err := components.ParseHash(hash)
	if err != nil {
		return false
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false
	}
	return string(h.Sum(nil)) == string(want)
}

// copyInstalled installs a copy of the binary installed at from as dest,
// atomically as install does.
func copyInstalled(from, dest string) error {
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil { //nolint:gosec // as install's
		return err
	}
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	return atomicfile.WriteFunc(dest, 0o755, func(f *os.File) error {
		_, err := io.Copy(f, src)
		return err
	})
}

func (i *Installer) install(ctx context.Context, c *componentsv1.Component) error {
	want, _ := components.ParseHash(c.GetHash())
	dir := filepath.Dir(c.GetInstallPath())
	if c.GetExtract() {
		dir = c.GetInstallPath()
	}
	// Install directories hold programs every user runs (/usr/local/bin,
	// /opt/cni/bin): world-readable, as the distribution's own.
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // see above
		return err
	}
	// The download lands next to its destination, so moving it into place
	// is a rename on one file system.
	if !c.GetExtract() {
		return atomicfile.WriteFunc(c.GetInstallPath(), 0o755, func(f *os.File) error {
			return i.download(ctx, c.GetUrl(), f, want)
		})
	}
	tmp, err := os.CreateTemp(dir, ".gatehouse-download-*")
	if err != nil {
		return err
	}
	defer func() {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
	}()
	if err := i.download(ctx, c.GetUrl(), tmp, want); err != nil {
		return err
	}
	return extract(tmp, c.GetInstallPath())
}

// download fetches url into f and checks its digest, retrying transient
// failures with backoff up to the configured attempts; a digest mismatch
// is never retried.
func (i *Installer) download(ctx context.Context, url string, f *os.File, want []byte) error {
	backoff := i.opts.Backoff
	for attempt := 1; ; attempt++ {
		err := i.fetchVerified(ctx, url, f, want)
		if err == nil || errors.Is(err, errHashMismatch) || !transient(err) || attempt == i.opts.Attempts {
			return err
		}
		i.opts.Log.Warn("Download failed; retrying", "url", redact(url), "attempt", attempt, "error", err.Error())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// transientError marks a failure worth retrying.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

func transient(err error) bool {
	var t *transientError
	return errors.As(err, &t)
}

// fetchVerified writes the content at rawURL into f (truncated first) and
// checks its digest.
func (i *Installer) fetchVerified(ctx context.Context, rawURL string, f *os.File, want []byte) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	body, err := i.open(ctx, rawURL)
	if err != nil {
		return err
	}
	defer body.Close()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), body); err != nil {
		return &transientError{fmt.Errorf("downloading %s: %w", redact(rawURL), err)}
	}
	if got := h.Sum(nil); string(got) != string(want) {
		return fmt.Errorf("%w: %s has sha256:%x, pinned sha256:%x", errHashMismatch, redact(rawURL), got, want)
	}
	return nil
}

// open returns the content at rawURL.
func (i *Installer) open(ctx context.Context, rawURL string) (io.ReadCloser, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("file URL %s names host %q; only local files are supported", rawURL, u.Host)
		}
		return os.Open(u.Path)
	case "data":
		data, err := components.ParseDataURL(rawURL)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(strings.NewReader(string(data))), nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := i.opts.Client.Do(req)
	if err != nil {
		return nil, &transientError{fmt.Errorf("downloading %s: %w", redact(rawURL), err)}
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		err := fmt.Errorf("downloading %s: HTTP %s", redact(rawURL), resp.Status)
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			return nil, &transientError{err}
		}
		return nil, err
	}
	return resp.Body, nil
}

// redact shortens data URLs for messages.
func redact(rawURL string) string {
	if strings.HasPrefix(rawURL, "data:") && len(rawURL) > 40 {
		return rawURL[:40] + "…"
	}
	return rawURL
}

// extract unpacks the gzip-compressed tar archive f into a fresh directory
// next to dest and then moves each entry into dest, so a broken archive
// installs nothing. Entries may be directories, regular files and symlinks
// staying inside the archive; anything else, or a path leaving it, is
// refused.
func extract(f *os.File, dest string) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	staging, err := os.MkdirTemp(filepath.Dir(dest), ".gatehouse-extract-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(staging)
	if err := unpack(f, staging); err != nil {
		return err
	}
	entries, err := os.ReadDir(staging)
	if err != nil {
		return err
	}
	for _, e := range entries {
		target := filepath.Join(dest, e.Name())
		if e.IsDir() {
			if err := os.RemoveAll(target); err != nil {
				return err
			}
		}
		if err := os.Rename(filepath.Join(staging, e.Name()), target); err != nil {
			return err
		}
	}
	return nil
}

func unpack(r io.Reader, dir string) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("unpacking: not a gzip archive: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("unpacking: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "." {
			continue
		}
		if !fs.ValidPath(name) {
			return fmt.Errorf("unpacking: entry %q leaves the archive", hdr.Name)
		}
		if err := mkdirAll(root, path.Dir(name)); err != nil {
			return fmt.Errorf("unpacking %s: %w", name, err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = mkdirAll(root, name)
		case tar.TypeReg:
			err = writeFile(root, name, tr, hdr.FileInfo().Mode().Perm())
		case tar.TypeSymlink:
			target := path.Join(path.Dir(name), hdr.Linkname) //nolint:gosec // only checked here, not opened; os.Root confines the write anyway
			if path.IsAbs(hdr.Linkname) || !fs.ValidPath(target) {
				return fmt.Errorf("unpacking: symlink %q points out of the archive", hdr.Name)
			}
			err = root.Symlink(hdr.Linkname, name)
		default:
			return fmt.Errorf("unpacking: entry %q has unsupported type %q", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			return fmt.Errorf("unpacking %s: %w", name, err)
		}
	}
}

func mkdirAll(root *os.Root, name string) error {
	if name == "." {
		return nil
	}
	return root.MkdirAll(name, 0o755)
}

func writeFile(root *os.Root, name string, r io.Reader, perm fs.FileMode) error {
	f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
