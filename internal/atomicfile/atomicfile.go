// Package atomicfile replaces files so that readers see either the old
// content or the whole new one, never a partial write, and a failed write
// leaves nothing behind (no temporary file, no truncated target).
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write writes data to path with mode perm atomically (see WriteFunc).
func Write(path string, data []byte, perm fs.FileMode) error {
	return WriteFunc(path, perm, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// WriteFunc writes path atomically: write fills a temporary file in path's
// directory (which must exist), which is then given mode perm, synced to
// disk and renamed over path (rename(2) is atomic within a file system);
// the directory is synced too, so that the rename survives a crash or a
// reset right after (fsync(2): syncing a file does not sync its directory
// entry). Errors name path; on any error the temporary file is removed and path is
// unchanged.
func WriteFunc(path string, perm fs.FileMode, write func(*os.File) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
			err = fmt.Errorf("writing %s: %w", path, err)
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := errors.Join(tmp.Chmod(perm), tmp.Sync()); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes the entries of directory dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
