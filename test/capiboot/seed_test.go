package capiboot

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// noCloudSeed writes a NoCloud seed disk to path: a FAT file system
// labelled CIDATA holding user-data (the bootstrap data Secret's value, as
// an infrastructure provider hands it over) and meta-data (instance-id and
// local-hostname), which cloud-init's NoCloud datasource reads from any
// disk with that label (cloud-init's docs, "NoCloud"). It uses mkfs.vfat
// (dosfstools) and mcopy (mtools), which the node image's build needs too.
func noCloudSeed(ctx context.Context, path string, userData []byte, instanceID, hostname string) error {
	dir, err := os.MkdirTemp(filepath.Dir(path), "seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	meta := fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", instanceID, hostname)
	files := map[string][]byte{"user-data": userData, "meta-data": []byte(meta)}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	// 2 MiB: mkfs.vfat's smallest FAT12 file system with room to spare;
	// -C creates the file, sized in KiB blocks.
	if out, err := exec.CommandContext(ctx, "mkfs.vfat", "-C", "-n", "CIDATA", path, "2048").CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.vfat: %w: %s", err, out)
	}
	for _, name := range []string{"user-data", "meta-data"} {
		cmd := exec.CommandContext(ctx, "mcopy", "-i", path, filepath.Join(dir, name), "::"+name)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("mcopy %s: %w: %s", name, err, out)
		}
	}
	return nil
}

// TestNoCloudSeed: the seed is a FAT file system labelled CIDATA whose
// user-data and meta-data hold what was given.
func TestNoCloudSeed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seed.img")
	if err := noCloudSeed(t.Context(), path, []byte("#cloud-config\nruncmd: [[true]]\n"), "i-1", "worker-1"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "blkid", "-o", "export", path).CombinedOutput()
	if err != nil {
		t.Fatalf("blkid: %v: %s", err, out)
	}
	for _, want := range []string{"LABEL=CIDATA", "TYPE=vfat"} {
		if !containsLine(string(out), want) {
			t.Errorf("blkid says %q, want a line %s", out, want)
		}
	}
	for name, want := range map[string]string{"user-data": "#cloud-config\nruncmd: [[true]]\n", "meta-data": "instance-id: i-1\nlocal-hostname: worker-1\n"} {
		got, err := exec.CommandContext(t.Context(), "mtype", "-i", path, "::"+name).Output()
		if err != nil || string(got) != want {
			t.Errorf("%s holds %q (%v), want %q", name, got, err, want)
		}
	}
}

func containsLine(text, line string) bool {
	return slices.Contains(strings.Split(text, "\n"), line)
}
