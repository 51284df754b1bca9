package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Partition types of the Discoverable Partitions Specification
// (uapi-group.org/specifications/specs/discoverable_partitions_specification).
const (
	typeESP        = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
	typeRootX86_64 = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
	typeRootVerity = "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5"
)

// Disk geometry: 512-byte sectors, partitions aligned to 1 MiB, an EFI
// system partition of espSize (FAT32 of 512-byte clusters needs at least
// 33 MiB; 64 MiB holds a UKI of up to about 60 MiB).
const (
	sectorSize = 512
	mib        = 1 << 20
	espSize    = 64 * mib
)

// partition is one GPT partition.
type partition struct {
	// name is the GPT partition name (PARTLABEL), typeGUID its type and
	// uuid its unique GUID (PARTUUID, lower case).
	name, typeGUID, uuid string
	// start and size are in bytes, multiples of 1 MiB.
	start, size int64
	// readOnly sets GPT attribute bit 60 (DPS: mount read-only).
	readOnly bool
}

// layout is the image's disk: the EFI system partition, the root
// (squashfs) and its dm-verity hash partition.
type layout struct {
	diskGUID          string
	esp, root, verity partition
	size              int64
}

// newLayout lays out a disk for a root of rootSize bytes and a hash tree
// of veritySize bytes with root hash rootHash (32 bytes). Its GUIDs are
// derived from the root hash, as systemd-repart derives them for a
// dm-verity root (DPS: the root partition's UUID is the root hash's first
// 128 bits, the verity partition's its last 128 bits), so a disk is the
// same wherever it is built and its partitions are found from the command
// line's roothash=.
func newLayout(rootHash []byte, rootSize, veritySize int64) layout {
	l := layout{diskGUID: derivedUUID(rootHash, "disk")}
	l.esp = partition{name: "esp", typeGUID: typeESP, uuid: derivedUUID(rootHash, "esp"), start: mib, size: espSize}
	l.root = partition{name: "root-x86-64", typeGUID: typeRootX86_64, uuid: formatUUID(rootHash[:16]),
		start: l.esp.start + l.esp.size, size: roundUp(rootSize, mib), readOnly: true}
	l.verity = partition{name: "root-x86-64-verity", typeGUID: typeRootVerity, uuid: formatUUID(rootHash[16:32]),
		start: l.root.start + l.root.size, size: roundUp(veritySize, mib), readOnly: true}
	// 1 MiB at the end holds the backup GPT (33 sectors).
	l.size = l.verity.start + l.verity.size + mib
	return l
}

func (l layout) partitions() []partition { return []partition{l.esp, l.root, l.verity} }

// sfdiskScript is the layout as an sfdisk(8) script.
func (l layout) sfdiskScript() string {
	var b strings.Builder
	fmt.Fprintf(&b, "label: gpt\nlabel-id: %s\nunit: sectors\nsector-size: %d\nfirst-lba: %d\n\n",
		l.diskGUID, sectorSize, mib/sectorSize)
	for _, p := range l.partitions() {
		fmt.Fprintf(&b, "start=%d, size=%d, type=%s, uuid=%s, name=%q", p.start/sectorSize, p.size/sectorSize, p.typeGUID, p.uuid, p.name)
		if p.readOnly {
			b.WriteString(`, attrs="GUID:60"`)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func roundUp(v, to int64) int64 { return (v + to - 1) / to * to }

// formatUUID formats 16 bytes as a UUID string, lower case (as blkid and
// /dev/disk/by-partuuid show them, and so as the command line names them).
func formatUUID(b []byte) string {
	h := hex.EncodeToString(b[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// derivedUUID is a random-looking (version 4, RFC 9562) UUID derived from
// seed and purpose: the same inputs give the same UUID.
func derivedUUID(seed []byte, purpose string) string {
	h := sha256.Sum256(append([]byte("gatehouse-image "+purpose+" "), seed...))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	return formatUUID(h[:16])
}

// fatVolumeID is the EFI system partition's FAT volume ID (8 hex digits),
// derived from the root hash.
func fatVolumeID(rootHash []byte) string {
	h := sha256.Sum256(append([]byte("gatehouse-image esp-volume-id "), rootHash...))
	return hex.EncodeToString(h[:4])
}

// makeESP makes the FAT32 EFI system partition image out (espSize bytes)
// holding uki as \EFI\BOOT\BOOTX64.EFI (the removable-media path UEFI
// firmware boots without a boot entry, UEFI 2.10 §3.5.1.1), with
// mkfs.vfat and mtools, nothing mounted. Every time stamp is epoch and
// the volume ID volumeID, so the same UKI gives the same bytes.
func makeESP(ctx context.Context, out, uki, volumeID string, epoch int64) error {
	if fi, err := os.Stat(uki); err != nil {
		return err
	} else if fi.Size() > espSize-4*mib {
		return fmt.Errorf("the UKI of %d MiB does not fit the %d MiB EFI system partition", fi.Size()/mib, espSize/mib)
	}
	if err := os.Remove(out); err != nil && !os.IsNotExist(err) {
		return err
	}
	t := time.Unix(epoch, 0)
	if err := os.Chtimes(uki, t, t); err != nil {
		return err
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "SOURCE_DATE_EPOCH=" + strconv.FormatInt(epoch, 10), "MTOOLS_SKIP_CHECK=1", "HOME=/nonexistent"}
	c := command{env: env}
	if _, err := run(ctx, c, "mkfs.vfat", "-C", "-F", "32", "-S", strconv.Itoa(sectorSize), "-s", "1", "-n", "ESP",
		"-i", volumeID, "--invariant", out, strconv.Itoa(espSize/1024)); err != nil {
		return err
	}
	if _, err := run(ctx, c, "mmd", "-i", out, "::/EFI", "::/EFI/BOOT"); err != nil {
		return err
	}
	_, err := run(ctx, c, "mcopy", "-m", "-i", out, uki, "::/EFI/BOOT/BOOTX64.EFI")
	return err
}

// writeDisk writes the raw disk out: the GPT of l (sfdisk), then each
// partition's image at its offset. The space after an image within its
// partition stays zero.
func writeDisk(ctx context.Context, out string, l layout, images map[string]string) error {
	f, err := os.OpenFile(out, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644) //nolint:gosec // a public image
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(l.size); err != nil {
		return err
	}
	cmd := command{env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}, stdin: l.sfdiskScript()}
	if _, err := run(ctx, cmd, "sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", "--wipe", "never", out); err != nil {
		return fmt.Errorf("writing the partition table: %w", err)
	}
	for _, p := range l.partitions() {
		src, ok := images[p.name]
		if !ok {
			return fmt.Errorf("no image for partition %s", p.name)
		}
		if err := writeAt(f, src, p); err != nil {
			return err
		}
	}
	return f.Close()
}

// writeAt copies the file src into f at p's offset; it must fit p.
func writeAt(f *os.File, src string, p partition) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > p.size {
		return fmt.Errorf("%s (%d bytes) does not fit partition %s (%d bytes)", src, fi.Size(), p.name, p.size)
	}
	if _, err := io.Copy(io.NewOffsetWriter(f, p.start), in); err != nil {
		return fmt.Errorf("writing partition %s: %w", p.name, err)
	}
	return nil
}
