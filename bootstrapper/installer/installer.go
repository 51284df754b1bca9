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

// Install installs every component in order, after validating them all.
// It works in two phases: every component is first downloaded next to
// its install path and checked against its pinned digest (archives
// unpacked beside their directory), and only when all of them are is
// each moved into place. So a component that fails (a mirror serving a
// changed file, a download that breaks off) installs nothing at all, not
// even the components before it; the error names the install path, the
// URL and, for a digest mismatch, the pinned and the received digest. A
// binary whose digest an earlier component of the list had (one
// multi-call binary installed under several names, from one URL or from
// several: a mirror's paths of the official names) is copied from that
// one, which was checked, and not fetched again: equal SHA-256 digests
// mean equal bytes. A binary whose install
// path already holds the pinned digest (the node image's baked binaries,
// a link to one multi-call binary, on a read-only root) is left as it is.
func (i *Installer) Install(ctx context.Context, list []*componentsv1.Component) (err error) {
	for _, c := range list {
		if err := components.Validate(c); err != nil {
			return err
		}
	}
	var plan []staged
	defer func() {
		for _, s := range plan {
			s.discard()
		}
	}()
	planned := map[string]string{} // digest of a binary → where it is installed
	held := map[string]bool{}      // real file and digest that holds confirmed in this call
	for _, c := range list {
		key := c.GetHash()
		if !c.GetExtract() && holdsOnce(held, c.GetInstallPath(), c.GetHash()) {
			// The node image bakes the pinned binaries into its read-only
			// root (docs/image.md): nothing to fetch, nowhere to write.
			planned[key] = c.GetInstallPath()
			plan = append(plan, staged{c: c, held: true})
			continue
		}
		if from, ok := planned[key]; ok && !c.GetExtract() {
			plan = append(plan, staged{c: c, copyFrom: from})
			continue
		}
		s, err := i.stage(ctx, c)
		if err != nil {
			return fmt.Errorf("installing %s: %w", c.GetInstallPath(), err)
		}
		plan = append(plan, s)
		if !c.GetExtract() {
			planned[key] = c.GetInstallPath()
		}
	}
	for _, s := range plan {
		c := s.c
		var err error
		switch {
		case s.held:
			i.opts.Log.Info("Component already installed", "path", c.GetInstallPath(), "hash", c.GetHash())
			continue
		case s.copyFrom != "":
			err = copyInstalled(s.copyFrom, c.GetInstallPath())
		case s.file != "":
			err = os.Rename(s.file, c.GetInstallPath())
		default:
			err = moveEntries(s.dir, c.GetInstallPath())
		}
		if err != nil {
			return fmt.Errorf("installing %s: %w", c.GetInstallPath(), err)
		}
		i.opts.Log.Info("Installed component", "url", c.GetUrl(), "path", c.GetInstallPath(), "extract", c.GetExtract())
	}
	return nil
}

// staged is one component of an Install: downloaded and checked, waiting
// to be moved into place.
type staged struct {
	c *componentsv1.Component
	// held says the install path holds the pinned digest already.
	held bool
	// copyFrom is the install path of an earlier component with the same
	// URL and digest.
	copyFrom string
	// file is the checked binary next to its install path; dir the
	// unpacked archive next to its install directory.
	file, dir string
}

// discard removes what s left staged (nothing once it was moved).
func (s staged) discard() {
	if s.file != "" {
		_ = os.Remove(s.file)
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
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

// stage downloads c next to where it is installed and checks its digest;
// an archive is unpacked into a fresh directory beside its install
// directory, so a broken archive stages nothing.
func (i *Installer) stage(ctx context.Context, c *componentsv1.Component) (staged, error) {
	want, _ := components.ParseHash(c.GetHash())
	dir := filepath.Dir(c.GetInstallPath())
	if c.GetExtract() {
		dir = c.GetInstallPath()
	}
	// Install directories hold programs every user runs (/usr/local/bin,
	// /opt/cni/bin): world-readable, as the distribution's own.
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // see above
		return staged{}, err
	}
	// The download lands next to its destination, so moving it into place
	// is a rename on one file system.
	tmp, err := os.CreateTemp(dir, ".gatehouse-download-*")
	if err != nil {
		return staged{}, err
	}
	keep := false
	defer func() {
		_ = tmp.Close()
		if !keep {
			_ = os.Remove(tmp.Name())
		}
	}()
	if err := i.download(ctx, c.GetUrl(), tmp, want); err != nil {
		return staged{}, err
	}
	if !c.GetExtract() {
		if err := tmp.Chmod(0o755); err != nil {
			return staged{}, err
		}
		if err := tmp.Sync(); err != nil {
			return staged{}, err
		}
		keep = true
		return staged{c: c, file: tmp.Name()}, nil
	}
	unpacked, err := unpackBeside(tmp, c.GetInstallPath())
	if err != nil {
		return staged{}, err
	}
	return staged{c: c, dir: unpacked}, nil
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

// unpackBeside unpacks the gzip-compressed tar archive f into a fresh
// directory next to dest and returns it; moveEntries then moves each
// entry into dest. Entries may be directories, regular files and symlinks
// staying inside the archive; anything else, or a path leaving it, is
// refused.
func unpackBeside(f *os.File, dest string) (string, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	staging, err := os.MkdirTemp(filepath.Dir(dest), ".gatehouse-extract-*")
	if err != nil {
		return "", err
	}
	if err := unpack(f, staging); err != nil {
		_ = os.RemoveAll(staging)
		return "", err
	}
	return staging, nil
}

// moveEntries moves every entry of staging into dest, replacing a
// directory of the same name, and removes staging.
func moveEntries(staging, dest string) error {
	defer os.RemoveAll(staging)
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
