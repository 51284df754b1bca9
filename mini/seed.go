package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// A containerd seed is a containerd root directory holding the node
// images, imported from the image archive and unpacked once, by a
// containerd of its own. A node's containerd starts from a copy of it, as
// a machine image comes with its container images, instead of importing
// and unpacking the archive itself: in a cluster of three nodes that is
// over ten CPU-seconds less at the start. The copy links the files that
// containerd never changes (content blobs and unpacked layers) and copies
// the rest (its databases); a node whose seed cannot be linked (another
// file system) imports the archive as before.

// seedImmutable are the directories of a containerd root whose files
// containerd never writes once they are there: content blobs (named by
// their digest) and committed snapshots (the unpacked layers, which
// containers only ever see as read-only lower layers).
var seedImmutable = []string{
	"io.containerd.content.v1.content/blobs",
	"io.containerd.snapshotter.v1.overlayfs/snapshots",
}

// buildSeed makes dir, if it does not exist yet, a containerd root with
// the images of archive, named refs, imported and unpacked (for the
// overlayfs snapshotter, in the k8s.io namespace the kubelet uses), and
// no other images. It starts from a copy of the seed base, when there is
// one (an earlier archive's): the layers the archives share are then not
// unpacked again. It is built next to dir and renamed into place, so an
// interrupted build leaves no seed under dir's name.
func buildSeed(ctx context.Context, archive string, refs []string, dir, base string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	work, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	tmp := filepath.Join(work, "root")
	if base == "" || linkSeed(base, tmp) != nil {
		if err := os.Mkdir(tmp, 0o711); err != nil { //nolint:gosec // a root file system's mode: others traverse it, as / on a node
			return err
		}
	}
	// The socket's path must be short; state holds nothing else.
	state, err := os.MkdirTemp("", "gatehouse-seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	sock := filepath.Join(state, "containerd.sock")
	config := filepath.Join(state, "config.toml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %q
`, tmp, state, sock), 0o600); err != nil {
		return err
	}
	var log strings.Builder
	// Its own mount namespace: the mounts of unpacking never reach the
	// host's, even when it is killed.
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "containerd", "--config", config)
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting a containerd to unpack the images: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			return errors.Join(errors.New("containerd did not stop within 10 s"), <-exited)
		}
	}
	ctr := func(args ...string) error {
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	err = poll(ctx, 50*time.Millisecond, time.Minute, "the unpacking containerd to start", func() (bool, error) {
		select {
		case err := <-exited:
			return false, fmt.Errorf("containerd exited: %w: %s", err, log.String())
		default:
		}
		return ctr("version") == nil, nil
	})
	if err == nil {
		err = ctr("-n", "k8s.io", "images", "import", archive)
	}
	if err == nil {
		err = removeOtherImages(ctx, sock, refs)
	}
	if serr := stop(); err == nil && serr != nil {
		err = fmt.Errorf("stopping the unpacking containerd: %w: %s", serr, log.String())
	}
	if err != nil {
		return fmt.Errorf("unpacking the node images into a containerd seed: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return err
	}
	return nil // the same seed built by another mini up at the same time is as good
}

// linkSeed makes dst (which must not exist) a containerd root with the
// content of the seed src: the files of seedImmutable are hard links to
// the seed's, the others copies, so no node changes the seed or another
// node's root. It fails, leaving nothing, when src is on another file
// system than dst.
func linkSeed(src, dst string) (err error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil { //nolint:gosec // like /var/lib
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	err = filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(tmp, rel)
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case rel == ".":
			return os.Chmod(tmp, info.Mode().Perm())
		case e.IsDir():
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			// Exactly the seed's mode: the sticky bit of /tmp in a layer too.
			return os.Chmod(target, info.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid))
		case e.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target) //nolint:gosec // the seed is this program's own root-owned cache, the target a fresh private temporary directory
		case e.Type().IsRegular() && immutable(rel):
			return os.Link(path, target) //nolint:gosec // as above
		case e.Type().IsRegular():
			return copyFile(path, target, info.Mode().Perm())
		default:
			return fmt.Errorf("%s: a %s, which a seed does not hold", path, info.Mode().Type())
		}
	})
	if err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// removeOtherImages removes the images of the containerd at sock that
// are not refs (those an earlier archive's seed had).
func removeOtherImages(ctx context.Context, sock string, refs []string) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "images", "ls", "-q").Output()
	if err != nil {
		return fmt.Errorf("listing the seed's images: %w", err)
	}
	var other []string
	for _, name := range strings.Fields(string(out)) {
		if !slices.Contains(refs, name) {
			other = append(other, name)
		}
	}
	if len(other) == 0 {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "-n", "k8s.io", "images", "rm"}, other...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("removing an earlier archive's images from the seed: %w: %s", err, out)
	}
	return nil
}

// latestSeed is the most recently used seed in dir other than except
// ("" when there is none).
func latestSeed(dir, except string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	latest, when := "", time.Time{}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.IsDir() || !strings.HasSuffix(e.Name(), ".containerd") || strings.HasPrefix(e.Name(), ".") || p == except {
			continue
		}
		// Its archive's time: the cache touches an archive when used.
		info, err := os.Stat(strings.TrimSuffix(p, ".containerd") + ".tar")
		if err != nil {
			continue
		}
		if info.ModTime().After(when) {
			latest, when = p, info.ModTime()
		}
	}
	return latest
}

func immutable(rel string) bool {
	for _, d := range seedImmutable {
		if strings.HasPrefix(rel, d+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.WriteFunc(dst, perm, func(f *os.File) error {
		_, err := io.Copy(f, in)
		return err
	})
}
