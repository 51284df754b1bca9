package build

import (
	"context"
	"debug/pe"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Roles are the node roles an image is made for, as gatehouse.role= names
// them on the kernel command line (the bootstrapper's
// --role-from-kernel-cmdline reads it). The file names of a role's outputs
// use fileRole.
const (
	roleControlPlane = "controlPlane"
	roleWorker       = "worker"
)

func roles() []string { return []string{roleControlPlane, roleWorker} }

// fileRole is a role's name in output file names: node-controlplane.raw.
func fileRole(role string) string { return strings.ToLower(role) }

// cmdline is the kernel command line of the image of role: the dm-verity
// root opened by the initrd (scripts/local-top/gatehouse-verity) from the
// root and hash partitions (PARTUUID in lower case, as blkid and udev
// name them; derived from the root hash as
// systemd-repart derives them), systemd's own verity generator off (the
// initrd opened it), the role, the serial console, and a reboot 10 s after
// a panic. It is measured (PCR 11 through the UKI's .cmdline section), so
// it holds nothing node-specific.
func cmdline(rootHash string, l layout, role string) string {
	return strings.Join([]string{
		"root=/dev/mapper/root", "ro", "rootfstype=squashfs",
		"roothash=" + rootHash,
		"gatehouse.verity.data=PARTUUID=" + strings.ToLower(l.root.uuid),
		"gatehouse.verity.hash=PARTUUID=" + strings.ToLower(l.verity.uuid),
		"systemd.verity=no",
		"gatehouse.role=" + role,
		"console=ttyS0", "panic=10",
	}, " ")
}

// ukiSection is a section the UKI adds to systemd-stub.
type ukiSection struct {
	name string
	file string
}

// sectionAlign is the alignment of the added sections' addresses: a page,
// which is at least the stub's SectionAlignment.
const sectionAlign = 0x1000

// ukiLayout returns the virtual address of each section, in order, placed
// after the stub's last section at increasing page-aligned addresses
// (systemd 252's objcopy recipe, systemd-stub(7)). sizes are the sections'
// sizes in bytes; stubEnd is the end of the stub's last section.
func ukiLayout(stubEnd uint64, sizes []int64) []uint64 {
	vmas := make([]uint64, len(sizes))
	next := alignUp(stubEnd, sectionAlign)
	for i, size := range sizes {
		vmas[i] = next
		next = alignUp(next+uint64(size), sectionAlign)
	}
	return vmas
}

func alignUp(v, to uint64) uint64 { return (v + to - 1) / to * to }

// stubEnd returns the end (virtual address plus size) of the last section
// of the PE image at path.
func stubEnd(path string) (uint64, error) {
	f, err := pe.Open(path)
	if err != nil {
		return 0, fmt.Errorf("reading the stub %s: %w", path, err)
	}
	defer f.Close()
	var end uint64
	for _, s := range f.Sections {
		end = max(end, uint64(s.VirtualAddress)+uint64(max(s.VirtualSize, s.Size)))
	}
	if end == 0 {
		return 0, fmt.Errorf("the stub %s has no sections", path)
	}
	return end, nil
}

// makeUKI joins systemd-stub with os-release, the command line, the kernel
// and the initrd into the unified kernel image out, with objcopy as
// systemd 252 documents it. --preserve-dates keeps the stub's PE time
// stamp (0), so the same inputs give the same bytes.
func makeUKI(ctx context.Context, stub, osRelease, cmdlineFile, kernel, initrd, out string) error {
	sections := []ukiSection{{".osrel", osRelease}, {".cmdline", cmdlineFile}, {".linux", kernel}, {".initrd", initrd}}
	sizes := make([]int64, len(sections))
	for i, s := range sections {
		fi, err := os.Stat(s.file)
		if err != nil {
			return err
		}
		sizes[i] = fi.Size()
	}
	end, err := stubEnd(stub)
	if err != nil {
		return err
	}
	args := []string{"--preserve-dates"}
	for i, vma := range ukiLayout(end, sizes) {
		s := sections[i]
		args = append(args, "--add-section", s.name+"="+s.file, "--change-section-vma", fmt.Sprintf("%s=%#x", s.name, vma))
	}
	if _, err := run(ctx, command{}, "objcopy", append(args, stub, out)...); err != nil {
		return err
	}
	return checkUKI(out, sections, sizes)
}

// checkUKI checks that the UKI at path has each section with its size.
func checkUKI(path string, sections []ukiSection, sizes []int64) error {
	f, err := pe.Open(path)
	if err != nil {
		return fmt.Errorf("reading the UKI %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	for i, s := range sections {
		sec := f.Section(s.name)
		if sec == nil || int64(sec.VirtualSize) != sizes[i] {
			return fmt.Errorf("the UKI %s lacks its %s section of %d bytes", filepath.Base(path), s.name, sizes[i])
		}
	}
	return nil
}
