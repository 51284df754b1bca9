package build

import (
	"bytes"
	"debug/pe"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// hostStub is systemd-stub as Debian's systemd-boot-efi installs it.
const hostStub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"

// requireTools stops the test when a program it runs is missing: under CI
// (CI set) it fails naming the Debian packages to install, elsewhere it
// skips.
func requireTools(t *testing.T) {
	t.Helper()
	err := checkTools(lookTool, assemblyTools())
	if err == nil {
		if _, serr := os.Stat(hostStub); serr != nil {
			err = fmt.Errorf("%s is missing (Debian package systemd-boot-efi): %w", hostStub, serr)
		}
	}
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal(err)
	}
	t.Skip(err)
}

// fakeParts is a tiny root file system with a fake kernel and initrd and
// the host's systemd-stub: what the assembly stage takes, without
// debootstrap.
func fakeParts(t *testing.T) parts {
	t.Helper()
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	files := map[string]string{
		"etc/os-release":            "ID=debian\n",
		"usr/bin/hello":             "#!/bin/sh\necho hello\n",
		"usr/lib/gatehouse/data":    strings.Repeat("gatehouse ", 50000),
		"etc/kubernetes/.keep":      "",
		"usr/lib/modules/6.1.0/dep": "",
	}
	for name, content := range files {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("hello", filepath.Join(tree, "usr/bin/hi")); err != nil {
		t.Fatal(err)
	}
	in := parts{
		tree: tree, kernel: filepath.Join(dir, "vmlinuz"), initrd: filepath.Join(dir, "initrd.img"),
		stub: hostStub, osRelease: filepath.Join(tree, "etc/os-release"), epoch: 1795745432,
	}
	if err := os.WriteFile(in.kernel, bytes.Repeat([]byte("MZ kernel "), 100000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in.initrd, bytes.Repeat([]byte("initrd "), 50000), 0o644); err != nil {
		t.Fatal(err)
	}
	return in
}

// assembleOnce assembles in into new directories and returns the outputs'
// digests, the result and the work directory.
func assembleOnce(t *testing.T, in parts) (map[string]string, *assembled, string) {
	t.Helper()
	work, out := t.TempDir(), t.TempDir()
	a, err := assembleParts(t.Context(), newProgress(io.Discard), in, work, out)
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if sums[e.Name()], err = sha256File(filepath.Join(out, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"root.squashfs", "root.verity"} {
		if sums[name], err = sha256File(filepath.Join(work, name)); err != nil {
			t.Fatal(err)
		}
	}
	return sums, a, out
}

// TestAssembleIsReproducible assembles the same parts twice, with the
// tree's time stamps changed in between, and wants byte-identical disks,
// UKIs, squashfs and hash tree; then checks what the disks hold.
func TestAssembleIsReproducible(t *testing.T) {
	requireTools(t)
	in := fakeParts(t)
	first, a, out := assembleOnce(t, in)
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(in.tree, "usr/bin/hello"), later, later); err != nil {
		t.Fatal(err)
	}
	second, _, _ := assembleOnce(t, in)
	if !maps.Equal(first, second) {
		t.Errorf("two assemblies of the same parts differ:\n%v\n%v", first, second)
	}
	want := []string{"node-controlplane.raw", "node-worker.raw", "root.squashfs", "root.verity", "uki-controlplane.efi", "uki-worker.efi"}
	if got := slices.Sorted(maps.Keys(first)); !slices.Equal(got, want) {
		t.Errorf("outputs %v, want %v", got, want)
	}
	if first["uki-controlplane.efi"] == first["uki-worker.efi"] {
		t.Error("the roles' UKIs are the same")
	}

	for _, im := range a.images {
		t.Run(im.Role, func(t *testing.T) {
			disk, uki := filepath.Join(out, im.Disk.File), filepath.Join(out, im.UKI.File)
			checkPartitionTable(t, disk, a.layout)
			checkESP(t, disk, uki)
			checkCmdline(t, uki, im.Cmdline)
			if !strings.Contains(im.Cmdline, "gatehouse.role="+im.Role) || !strings.Contains(im.Cmdline, "roothash="+a.verity.RootHash) {
				t.Errorf("command line %q lacks the role or the root hash", im.Cmdline)
			}
			checkPartitionMagic(t, disk, a.layout.root, "hsqs")
			checkPartitionMagic(t, disk, a.layout.verity, "verity\x00\x00")
		})
	}
}

// TestVerityRefusesAChangedRoot checks the hash tree against the root and
// a root with one byte flipped.
func TestVerityRefusesAChangedRoot(t *testing.T) {
	requireTools(t)
	in := fakeParts(t)
	work := t.TempDir()
	sq, ht := filepath.Join(work, "root.squashfs"), filepath.Join(work, "root.verity")
	if _, err := run(t.Context(), command{}, "mksquashfs", squashfsArgs(in.tree, sq, in.epoch)...); err != nil {
		t.Fatal(err)
	}
	v, err := formatVerity(t.Context(), sq, ht)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(t.Context(), command{}, "veritysetup", "verify", sq, ht, v.RootHash); err != nil {
		t.Fatalf("the built root does not verify: %v", err)
	}
	data, err := os.ReadFile(sq)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x01
	if err := os.WriteFile(sq, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t.Context(), command{}, "veritysetup", "verify", sq, ht, v.RootHash); err == nil {
		t.Fatal("a root with a flipped byte verifies")
	}
}

func checkPartitionTable(t *testing.T, disk string, l layout) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "sfdisk", "--json", disk).Output()
	if err != nil {
		t.Fatalf("sfdisk --json: %v", err)
	}
	var table struct {
		PartitionTable struct {
			Label      string `json:"label"`
			ID         string `json:"id"`
			Partitions []struct {
				Start int64  `json:"start"`
				Size  int64  `json:"size"`
				Type  string `json:"type"`
				UUID  string `json:"uuid"`
				Name  string `json:"name"`
				Attrs string `json:"attrs"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal(out, &table); err != nil {
		t.Fatal(err)
	}
	pt := table.PartitionTable
	if pt.Label != "gpt" || !strings.EqualFold(pt.ID, l.diskGUID) || len(pt.Partitions) != 3 {
		t.Fatalf("partition table %+v, want GPT %s with 3 partitions", pt, l.diskGUID)
	}
	for i, want := range l.partitions() {
		got := pt.Partitions[i]
		if got.Start*sectorSize != want.start || got.Size*sectorSize != want.size || !strings.EqualFold(got.Type, want.typeGUID) || !strings.EqualFold(got.UUID, want.uuid) || got.Name != want.name {
			t.Errorf("partition %d: %+v, want %+v", i+1, got, want)
		}
		if want.readOnly != strings.Contains(got.Attrs, "GUID:60") {
			t.Errorf("partition %s: attributes %q", want.name, got.Attrs)
		}
	}
}

// checkESP reads \EFI\BOOT\BOOTX64.EFI from the disk's EFI system
// partition with mtools and wants the UKI's bytes.
func checkESP(t *testing.T, disk, uki string) {
	t.Helper()
	got := filepath.Join(t.TempDir(), "BOOTX64.EFI")
	cmd := exec.CommandContext(t.Context(), "mcopy", "-i", fmt.Sprintf("%s@@%d", disk, mib), "::/EFI/BOOT/BOOTX64.EFI", got)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mcopy: %v: %s", err, out)
	}
	a, _ := sha256File(got)
	b, _ := sha256File(uki)
	if a != b {
		t.Errorf("the ESP's BOOTX64.EFI (%s) is not the UKI (%s)", a, b)
	}
}

func checkCmdline(t *testing.T, uki, want string) {
	t.Helper()
	f, err := pe.Open(uki)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	for _, s := range f.Sections {
		names = append(names, s.Name)
	}
	if !slices.Contains(names, ".sdmagic") || !slices.Equal(names[len(names)-4:], []string{".osrel", ".cmdline", ".linux", ".initrd"}) {
		t.Errorf("UKI sections %v: want the stub's, then .osrel, .cmdline, .linux, .initrd", names)
	}
	data, err := f.Section(".cmdline").Data()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(data[:f.Section(".cmdline").VirtualSize]); got != want {
		t.Errorf(".cmdline %q, want %q", got, want)
	}
	if f.TimeDateStamp != 0 {
		t.Errorf("PE time stamp %d: want the stub's 0", f.TimeDateStamp)
	}
}

func checkPartitionMagic(t *testing.T, disk string, p partition, magic string) {
	t.Helper()
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, len(magic))
	if _, err := f.ReadAt(buf, p.start); err != nil {
		t.Fatal(err)
	}
	if string(buf) != magic {
		t.Errorf("partition %s starts with %q, want %q", p.name, buf, magic)
	}
}
