package clustertest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// GPT partition type GUIDs of the node image's disks (docs/image.md).
const (
	PartitionESP  = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
	PartitionRoot = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"
)

// ChangedCommandLine writes to out a copy of disk (a node image disk)
// whose boot loader is uki with one character of its kernel command line
// changed (panic=10 → panic=11): it boots, and PCR 11's .cmdline event
// differs from the image's signed values. It uses objcopy (binutils),
// mcopy (mtools) and sfdisk (fdisk). It returns the changed UKI's path
// (in a test directory).
func ChangedCommandLine(t *testing.T, uki, disk, out string) string {
	t.Helper()
	work := t.TempDir()
	changedUKI := filepath.Join(work, "uki.efi")
	RunTool(t, "cp", uki, changedUKI)
	cmdline := sectionBytes(t, changedUKI, ".cmdline")
	changed := strings.Replace(string(cmdline), "panic=10", "panic=11", 1)
	if changed == string(cmdline) {
		t.Fatalf("the command line %q has no panic=10 to change", cmdline)
	}
	section := filepath.Join(work, "cmdline")
	if err := os.WriteFile(section, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	RunTool(t, "objcopy", "--update-section", ".cmdline="+section, changedUKI)
	RunTool(t, "cp", "--sparse=always", disk, out)
	esp := PartitionOffset(t, out, PartitionESP)
	RunTool(t, "mcopy", "-o", "-i", out+"@@"+strconv.FormatInt(esp, 10), changedUKI, "::/EFI/BOOT/BOOTX64.EFI")
	return changedUKI
}

// RunTool runs name with args and returns its combined output; it fails
// the test when the tool fails.
func RunTool(t *testing.T, name string, args ...string) string {
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
	RunTool(t, "objcopy", "-O", "binary", "--only-section="+name, file, out)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// PartitionOffset returns the byte offset of the first partition of disk
// with the GPT type GUID typ, read with sfdisk.
func PartitionOffset(t *testing.T, disk, typ string) int64 {
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
	if err := json.Unmarshal([]byte(RunTool(t, "sfdisk", "--json", disk)), &table); err != nil {
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
