package realboot

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestChangedCommandLineRefused: the control-plane disk with one character
// of its UKI's kernel command line changed boots (nothing on the machine
// checks it), but its evidence is refused, and the refusal names the
// .cmdline event of PCR 11 whose digest differs from the signed values.
func TestChangedCommandLineRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	work := t.TempDir()
	uki := filepath.Join(work, "uki.efi")
	copyFile(t, r.image.ControlPlaneUKI, uki)
	cmdline := sectionBytes(t, uki, ".cmdline")
	changed := strings.Replace(string(cmdline), "panic=10", "panic=11", 1)
	if changed == string(cmdline) {
		t.Fatalf("the command line %q has no panic=10 to change", cmdline)
	}
	section := filepath.Join(work, "cmdline")
	if err := os.WriteFile(section, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	runTool(t, "objcopy", "--update-section", ".cmdline="+section, uki)
	disk := filepath.Join(work, "node.raw")
	copyFile(t, r.image.ControlPlaneDisk, disk)
	esp := partitionOffset(t, disk, "C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
	runTool(t, "mcopy", "-o", "-i", disk+"@@"+strconv.FormatInt(esp, 10), uki, "::/EFI/BOOT/BOOTX64.EFI")

	vm := r.boot(t, disk, filepath.Join(work, "vm"))
	waitFor(t, vm, listening)
	out, err := r.try(t, "verify", "--config", r.config, "--node", r.endpoint(vm))
	if err == nil {
		t.Fatalf("a node booted with a changed command line was verified:\n%s", out)
	}
	for _, want := range []string{"PCR 11", ".cmdline"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not name %q:\n%s", want, out)
		}
	}
	t.Logf("refused:\n%s", out)
}

// TestFlippedRootByteDoesNotBoot: one flipped byte in the root partition
// (the squashfs superblock, read by the first mount) is caught by
// dm-verity: the root is not mounted and no bootstrapper runs.
func TestFlippedRootByteDoesNotBoot(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	work := t.TempDir()
	disk := filepath.Join(work, "node.raw")
	copyFile(t, r.image.ControlPlaneDisk, disk)
	offset := partitionOffset(t, disk, "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709")
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, offset+8); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b, offset+8); err != nil {
		t.Fatal(err)
	}
	f.Close()

	vm := r.boot(t, disk, filepath.Join(work, "vm"))
	refused := regexp.MustCompile(`(?i)verity.*(corrupt|fail|error)|Kernel panic|Gave up waiting for root|gatehouse-bootstrapper`)
	line := waitFor(t, vm, refused)
	if strings.Contains(line.Text, "gatehouse-bootstrapper") {
		t.Fatalf("the bootstrapper ran from a root with a flipped byte: %s", line.Text)
	}
	t.Logf("refused at boot: %s", line.Text)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	runTool(t, "cp", "--sparse=always", from, to)
}

func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sectionBytes returns the contents of a PE section of file.
func sectionBytes(t *testing.T, file, name string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "section")
	runTool(t, "objcopy", "-O", "binary", "--only-section="+name, file, out)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// partitionOffset returns the byte offset of the first partition of disk
// with the GPT type GUID typ, read with sfdisk.
func partitionOffset(t *testing.T, disk, typ string) int64 {
	t.Helper()
	var table struct {
		PartitionTable struct {
			SectorSize int64 `json:"sectorsize"`
			Partitions []struct {
				Start int64  `json:"start"`
				Type  string `json:"type"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal([]byte(runTool(t, "sfdisk", "--json", disk)), &table); err != nil {
		t.Fatal(err)
	}
	sector := table.PartitionTable.SectorSize
	if sector == 0 {
		sector = 512
	}
	for _, p := range table.PartitionTable.Partitions {
		if strings.EqualFold(p.Type, typ) {
			return p.Start * sector
		}
	}
	t.Fatalf("%s has no partition of type %s", disk, typ)
	return 0
}
