package build

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// recipeVersion names the recipe in the image (os-release's
// IMAGE_VERSION) and in every cache key.
const recipeVersion = "1"

// recipeFS holds the files the recipe adds to the root file system, at
// their paths in the image (recipe/rootfs/etc/fstab is /etc/fstab), and
// this package's own Go files: the recipe is both, and a change to either
// changes the cache keys (recipeDigest), so the cache never serves an
// image an older build made.
//
//go:embed all:recipe *.go
var recipeFS embed.FS

const recipeRoot = "recipe/rootfs"

// executable reports whether the recipe file at rel (a path in the image,
// without the leading slash) is a program.
func executable(rel string) bool {
	return strings.HasPrefix(rel, "usr/lib/gatehouse/") || strings.HasPrefix(rel, "etc/initramfs-tools/hooks/") ||
		strings.HasPrefix(rel, "etc/initramfs-tools/scripts/")
}

// recipeDigest is the hex SHA-256 digest of the recipe: its files and
// this package's Go files but its tests (paths and content).
func recipeDigest() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(recipeFS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(p, "_test.go") {
			return err
		}
		data, err := recipeFS.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(data))
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeRecipeFiles copies the recipe's files into tree: directories 0755,
// programs 0755, other files 0644, all owned by root.
func writeRecipeFiles(tree string) error {
	return fs.WalkDir(recipeFS, recipeRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, recipeRoot), "/")
		dst := filepath.Join(tree, filepath.FromSlash(rel))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755) //nolint:gosec // system directories
		}
		data, err := recipeFS.ReadFile(p)
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		if executable(rel) {
			mode = 0o755
		}
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return os.WriteFile(dst, data, mode)
	})
}

// stateDirs are the directories the bootstrapper binds the opened state
// disk over (bootstrapper/statedisk's StateDirs; a test keeps the two
// equal).
func stateDirs() []string {
	return []string{"/etc/kubernetes", "/etc/gatehouse", "/var/lib/kubelet", "/var/lib/etcd"}
}

// imageDirs must exist in the read-only root: mount points of the tmpfs
// file systems /etc/fstab mounts and of the state disk's bind mounts.
func imageDirs() []string {
	return append([]string{"/etc/cni/net.d", "/opt/cni/bin", "/var", "/tmp"}, stateDirs()...)
}

// enabledUnits are started at boot (cloud-init's four stages only when its
// generator, ds-identify, finds a seed disk: etc/cloud/cloud.cfg.d's
// 90-gatehouse.cfg); disabledUnits are Debian's defaults a
// node does without (apt's timers: the root is read-only; the getty on
// tty1: a node has no console login); maskedUnits never run:
// systemd-firstboot would ask for a locale on the console at every boot
// (machine-id is empty); no getty offers a login on any console; and
// systemd-pcrphase would extend PCR 11 with boot phases at times that race
// the bootstrapper's quote, and without an entry in the firmware's event
// log: PCR 11 holds the UKI's sections and nothing else (docs/image.md).
func enabledUnits() []string {
	return []string{"systemd-networkd.service", "systemd-resolved.service", "gatehouse-provision-network.service", "gatehouse-provision.service", "gatehouse-bootstrapper.service", "gatehouse-evidence.service", "gatehouse-kms.service",
		"cloud-init-local.service", "cloud-init.service", "cloud-config.service", "cloud-final.service"}
}

func disabledUnits() []string {
	return []string{"apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "e2scrub_all.timer", "e2scrub_reap.service", "getty@tty1.service"}
}

func maskedUnits() []string {
	return []string{"systemd-firstboot.service", "getty@.service", "serial-getty@.service",
		"systemd-pcrphase.service", "systemd-pcrphase-sysinit.service", "systemd-pcrphase-initrd.service"}
}

// configure makes the installed root file system at tree the node image's:
// the recipe's files, an empty machine-id (systemd makes one per boot in
// memory), no host name (DHCP's, or the provisioning's), the image's
// identity in os-release, the baked binaries, the units enabled at boot,
// and the mount points of the read-only root.
func configure(ctx context.Context, tree string, bins []binary) error {
	if err := writeRecipeFiles(tree); err != nil {
		return fmt.Errorf("writing the recipe's files: %w", err)
	}
	for _, f := range []string{"etc/hostname", "var/lib/dbus/machine-id"} {
		if err := os.Remove(filepath.Join(tree, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	// An empty machine-id: a transient one each boot. .updated: /etc
	// needs no update at boot (ConditionNeedsUpdate=/etc; the squashfs
	// gives /usr and it the same time).
	for f, content := range map[string]string{"etc/machine-id": "", "etc/.updated": ""} {
		if err := os.WriteFile(filepath.Join(tree, f), []byte(content), 0o444); err != nil { //nolint:gosec // public
			return err
		}
	}
	if err := appendOSRelease(filepath.Join(tree, "usr/lib/os-release")); err != nil {
		return err
	}
	for _, d := range imageDirs() {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil { //nolint:gosec // mount points
			return err
		}
	}
	if err := installBinaries(tree, bins); err != nil {
		return err
	}
	// No generator mounts the EFI system partition: the running node
	// never reads it.
	if err := maskGenerator(tree, "systemd-gpt-auto-generator"); err != nil {
		return err
	}
	for _, c := range [][]string{
		append([]string{"systemctl", "enable"}, enabledUnits()...),
		append([]string{"systemctl", "disable"}, disabledUnits()...),
		append([]string{"systemctl", "mask"}, maskedUnits()...),
	} {
		if _, err := inChroot(ctx, tree, "", nil, c...); err != nil {
			return err
		}
	}
	return nil
}

// maskGenerator keeps the systemd generator name from running
// (systemd.generator(7): a link to /dev/null in /etc/systemd/system-generators).
func maskGenerator(tree, name string) error {
	dir := filepath.Join(tree, "etc/systemd/system-generators")
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // system directory
		return err
	}
	link := filepath.Join(dir, name)
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.Symlink("/dev/null", link)
}

// appendOSRelease adds the image's identity to os-release
// (os-release(5): IMAGE_ID, IMAGE_VERSION), which the UKI's .osrel
// section carries too.
func appendOSRelease(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var lines []string
	for l := range strings.SplitSeq(strings.TrimRight(string(data), "\n"), "\n") {
		if !strings.HasPrefix(l, "IMAGE_ID=") && !strings.HasPrefix(l, "IMAGE_VERSION=") {
			lines = append(lines, l)
		}
	}
	lines = append(lines, "IMAGE_ID=gatehouse-node", "IMAGE_VERSION="+recipeVersion)
	// A new file, not one shared by a hard link.
	if err := os.Remove(file); err != nil {
		return err
	}
	return os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644) //nolint:gosec // public
}

// installBinaries copies bins into tree, programs 0755 owned by root.
func installBinaries(tree string, bins []binary) error {
	for _, b := range bins {
		dst := filepath.Join(tree, b.Path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil { //nolint:gosec // system directories
			return err
		}
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if b.LinkTo != "" {
			if err := os.Symlink(b.LinkTo, dst); err != nil {
				return err
			}
			continue
		}
		if err := copyFile(b.source, dst, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(dst, 0o755); err != nil { //nolint:gosec // a program
			return err
		}
	}
	return nil
}

// strippedPaths are removed from the image (glob patterns relative to the
// root): what a node never reads. Documentation but for the copyright
// files (kept: the licences travel with the image), manual pages,
// translations, apt's lists and caches, /boot (the kernel and initrd are
// in the UKI), /var (a tmpfs at run time), and kernel modules for
// hardware a server or VM node does not have (graphics, media, wireless,
// sound, Bluetooth, InfiniBand, staging drivers, …).
func strippedPaths(kernel string) []string {
	mod := path.Join("usr/lib/modules", kernel, "kernel")
	paths := []string{"boot/*", "usr/share/man", "usr/share/info", "usr/share/locale/*", "usr/share/lintian",
		"var/*", "usr/share/doc/*/*", "usr/share/bug", "usr/share/doc-base"}
	for _, d := range []string{
		"drivers/gpu", "drivers/media", "drivers/net/wireless", "drivers/infiniband", "drivers/staging",
		"drivers/bluetooth", "drivers/iio", "drivers/comedi", "drivers/isdn", "drivers/usb/gadget",
		"drivers/usb/serial", "drivers/input/joystick", "drivers/input/touchscreen", "drivers/input/tablet",
		"drivers/mmc", "drivers/memstick", "drivers/nfc", "drivers/atm", "drivers/pcmcia", "drivers/fpga",
		"drivers/parport", "drivers/thunderbolt", "drivers/w1", "drivers/video/fbdev", "drivers/power/supply",
		"sound", "net/wireless", "net/bluetooth", "net/mac80211", "net/nfc", "net/atm",
	} {
		paths = append(paths, path.Join(mod, d))
	}
	return paths
}

// keptInDoc are the files of /usr/share/doc/<package>/ that stay.
func keptInDoc() []string { return []string{"copyright"} }

// strip removes strippedPaths from tree.
func strip(tree, kernel string) error {
	for _, pattern := range strippedPaths(kernel) {
		matches, err := filepath.Glob(filepath.Join(tree, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if strings.Contains(pattern, "usr/share/doc/") && slices.Contains(keptInDoc(), filepath.Base(m)) {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return fmt.Errorf("stripping %s: %w", m, err)
			}
		}
	}
	// /var is a tmpfs at run time; its mount points of the state disk stay.
	for _, d := range imageDirs() {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil { //nolint:gosec // mount points
			return err
		}
	}
	return nil
}
