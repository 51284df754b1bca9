package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The cache keeps the keepBuilds most recently used assembled images, and
// every one used within keepUsed: another build must not remove the disk
// a VM is about to boot.
const (
	keepBuilds = 3
	keepUsed   = 24 * time.Hour
)

// assemblyInputs decide an assembled image: the root file system and the
// binaries baked into it (and the recipe, part of every key).
type assemblyInputs struct {
	root         *rootFS
	kube         []binary
	bootstrapper binary
}

// key is the assembly's cache key: the root file system's digest, each
// baked binary's name and digest, the recipe version and the digest of the
// recipe's files.
func (in assemblyInputs) key() (string, error) {
	recipe, err := recipeDigest()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "recipe %s %s\nrootfs %s\nepoch %d\n", recipeVersion, recipe, in.root.Digest, in.root.SourceDateEpoch)
	for _, b := range append(append([]binary(nil), in.kube...), in.bootstrapper) {
		fmt.Fprintf(h, "binary %s %s %s\n", b.Name, b.Path, b.SHA256)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// treeDigest is the hex SHA-256 digest of a directory tree's content: every
// entry's path, type, permission bits, owner, and its content (a file's
// SHA-256 digest, a symbolic link's target, a device's number), in
// lexical order. Modification times are left out: the image sets them all
// to SOURCE_DATE_EPOCH.
func treeDigest(root string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		var uid, gid uint32
		var rdev uint64
		if st != nil {
			uid, gid, rdev = st.Uid, st.Gid, st.Rdev
		}
		fmt.Fprintf(h, "%q %s %d:%d", rel, fi.Mode().String(), uid, gid)
		switch {
		case fi.Mode().IsRegular():
			sum, err := sha256File(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " %s", sum)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %q", target)
		case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice) != 0:
			fmt.Fprintf(h, " dev %d", rdev)
		}
		fmt.Fprintln(h)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hashing %s: %w", root, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lockCache takes the cache's lock, waiting (and saying so) while another
// build holds it, until ctx ends; the function returned releases it.
func lockCache(ctx context.Context, cache string, p *progress) (func(), error) {
	f, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644) //nolint:gosec // a lock
	if err != nil {
		return nil, fmt.Errorf("opening the image cache's lock: %w", err)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for said := false; ; said = true {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("locking the image cache: %w", err)
		}
		if !said {
			p.detail("Waiting for another image build using %s", cache)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for another image build using %s: %w", cache, ctx.Err())
		case <-tick.C:
		}
	}
}

// pruneBuilds removes the assembled images in dir (one directory each)
// but the keep most recently used and those used since notBefore. A
// build marks an image used by setting its directory's modification time.
func pruneBuilds(dir string, keep int, notBefore time.Time) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type build struct {
		path string
		made int64
	}
	var builds []build
	for _, e := range entries {
		if !e.IsDir() || filepath.Ext(e.Name()) == ".tmp" {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		builds = append(builds, build{filepath.Join(dir, e.Name()), fi.ModTime().UnixNano()})
	}
	sort.Slice(builds, func(i, j int) bool { return builds[i].made > builds[j].made })
	var errs []error
	for _, b := range builds[min(keep, len(builds)):] {
		if b.made < notBefore.UnixNano() {
			errs = append(errs, os.RemoveAll(b.path))
		}
	}
	return errors.Join(errs...)
}

// copyOutputs copies the outputs of the image in dir into out. Copies, not
// hard links: a VM booting a disk of out writes to it, and the cache's
// disk must stay as built.
func copyOutputs(dir, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil { //nolint:gosec // public artefacts
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		src, dst := filepath.Join(dir, e.Name()), filepath.Join(out, e.Name())
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := copyFile(src, dst, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies src to dst (created with perm).
func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return out.Close()
}
