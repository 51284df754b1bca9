package statedisk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// StateDirs are the node's state the state disk exists for: kubeadm's
// configuration, PKI and static Pod manifests, the kubelet's state and
// certificates, etcd's data, and Gatehouse's node files
// (docs/bootstrapper.md, "State disk").
var StateDirs = []string{"/etc/kubernetes", "/etc/gatehouse", "/var/lib/kubelet", "/var/lib/etcd"}

// Volume puts a node's state on its unlocked state disk: it maps the LUKS2
// disk (device-mapper), makes an ext4 file system on it the first time,
// mounts it at MountPoint and bind-mounts each of Dirs onto a directory
// of it. What a directory held before its first mount (files written
// before the disk was unlocked) is moved onto the disk. Its methods need
// root and a kernel with device-mapper (DeviceMapperAvailable).
type Volume struct {
	Disk *Disk
	// MapperName is the mapping's name, /dev/mapper/<MapperName>; unique
	// per node on a machine.
	MapperName string
	// MountPoint is where the file system is mounted, e.g.
	// /run/gatehouse/state.
	MountPoint string
	// Dirs are the directories that live on the disk (StateDirs).
	Dirs []string
	// Log gets one line per unlock saying since when the disk holds the
	// node's state (its Record); nil logs nothing.
	Log *slog.Logger
}

// Unlock maps the disk with key (if it is not mapped yet), makes its file
// system if it has none, mounts it and binds Dirs onto it. It is safe to
// repeat: what is done already is kept. Errors name the step.
func (v *Volume) Unlock(ctx context.Context, key []byte) error {
	dev := "/dev/mapper/" + v.MapperName
	if _, err := os.Stat(dev); errors.Is(err, os.ErrNotExist) {
		if err := v.Disk.Open(ctx, v.MapperName, key); err != nil {
			return err
		}
	}
	fsType, err := exec.CommandContext(ctx, "blkid", "-p", "-o", "value", "-s", "TYPE", dev).Output()
	var exit *exec.ExitError
	switch {
	case err == nil && strings.TrimSpace(string(fsType)) == "ext4":
	case err == nil:
		return fmt.Errorf("the opened state disk holds a %s file system, not ext4: it is not this node's state", strings.TrimSpace(string(fsType)))
	case errors.As(err, &exit) && exit.ExitCode() == 2: // blkid: nothing found
		if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-L", "gatehouse-state", dev).CombinedOutput(); err != nil {
			return fmt.Errorf("making the state disk's file system: %w: %s", err, out)
		}
	default:
		return fmt.Errorf("probing the state disk's file system: %w", err)
	}
	if err := v.mount(dev); err != nil {
		return err
	}
	boot, err := bootID()
	if err != nil {
		return err
	}
	record, err := recordOpen(v.MountPoint, boot, time.Now())
	if err != nil {
		return err
	}
	if v.Log != nil {
		v.Log.Info("The state disk is open and holds the node's state", "since", record.Created.Format(time.RFC3339),
			"createdInBoot", record.CreatedInBoot, "thisBoot", boot, "bootsOpened", record.Opened)
	}
	for _, dir := range v.Dirs {
		if err := v.bind(ctx, dir); err != nil {
			return err
		}
	}
	return nil
}

// Sync writes what was written to the state disk's file system through to
// the disk (syncfs(2) on MountPoint): a bootstrap calls it before it
// counts as done.
func (v *Volume) Sync() error {
	fd, err := unix.Open(v.MountPoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the state disk's mount point %s: %w", v.MountPoint, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncing the state disk's file system: %w", err)
	}
	return nil
}

// mount mounts dev at MountPoint unless something is mounted there.
func (v *Volume) mount(dev string) error {
	if err := os.MkdirAll(v.MountPoint, 0o700); err != nil {
		return err
	}
	if mounted, err := isMountPoint(v.MountPoint); err != nil || mounted {
		return err
	}
	if err := unix.Mount(dev, v.MountPoint, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mounting the state disk at %s: %w", v.MountPoint, err)
	}
	return nil
}

// bind makes dir the disk's copy of it: created (with what dir holds) the
// first time, then bind-mounted over dir.
func (v *Volume) bind(ctx context.Context, dir string) error {
	if mounted, err := isMountPoint(dir); err != nil || mounted {
		return err
	}
	onDisk := filepath.Join(v.MountPoint, dir)
	if _, err := os.Stat(onDisk); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // /etc/kubernetes and friends are world-readable directories
			return err
		}
		tmp := onDisk + ".partial"
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(tmp), 0o700); err != nil {
			return err
		}
		// cp -a keeps modes, owners and links; the rename makes it whole or absent.
		if out, err := exec.CommandContext(ctx, "cp", "-a", dir, tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("moving %s onto the state disk: %w: %s", dir, err, out)
		}
		if err := os.Rename(tmp, onDisk); err != nil {
			return err
		}
	}
	if err := unix.Mount(onDisk, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s onto the state disk: %w", dir, err)
	}
	return nil
}

// isMountPoint reports whether path is the root of a mount: its device
// differs from its parent's, or it is a bind mount listed in mountinfo.
func isMountPoint(path string) (bool, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	clean := filepath.Clean(path)
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && unescapeMountPath(f[4]) == clean {
			return true, nil
		}
	}
	return false, nil
}

// unescapeMountPath undoes mountinfo's octal escapes of space, tab,
// newline and backslash.
func unescapeMountPath(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}
