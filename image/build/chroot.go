package build

import (
	"context"
	"syscall"
)

// unshareMountAttr starts a process in a mount namespace of its own. Go
// makes the namespace's mounts private (MS_REC|MS_PRIVATE on /) before the
// program runs, as unshare(1) does, so nothing it mounts reaches the host,
// and its mounts vanish when its last process ends, however it ends.
func unshareMountAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
}

// chrootScript runs the command in its arguments chrooted into the root
// given as $1, with /proc, /sys and /dev mounted there, and with
// $GATEHOUSE_DEBS (when set) bound over apt's archive directory so that
// apt-get reads and keeps .deb files in the build's cache. It runs in a
// private mount namespace (unshareMountAttr): no unmount is needed.
const chrootScript = `set -eu
root=$1
shift
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --rbind /dev "$root/dev"
if [ -n "${GATEHOUSE_DEBS:-}" ]; then
	mkdir -p "$root/var/cache/apt/archives"
	mount --bind "$GATEHOUSE_DEBS" "$root/var/cache/apt/archives"
fi
exec chroot "$root" "$@"`

// chrootEnv is the whole environment of a program in the chroot: nothing
// of the caller's leaks in.
func chrootEnv(extra ...string) []string {
	return append([]string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LC_ALL=C.UTF-8",
		"DEBIAN_FRONTEND=noninteractive",
		"DEBCONF_NONINTERACTIVE_SEEN=true",
	}, extra...)
}

// inChroot runs argv chrooted into root with /proc, /sys and /dev mounted
// in a private mount namespace; debs, when not empty, is bound over apt's
// archive directory. env adds to chrootEnv.
func inChroot(ctx context.Context, root, debs string, env []string, argv ...string) ([]byte, error) {
	e := chrootEnv(env...)
	if debs != "" {
		e = append(e, "GATEHOUSE_DEBS="+debs)
	}
	args := append([]string{"-c", chrootScript, "sh", root}, argv...)
	return run(ctx, command{env: e, unshareMount: true}, "sh", args...)
}
