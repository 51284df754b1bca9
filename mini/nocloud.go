package mini

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// writeNoCloudSeed writes a NoCloud seed disk to path, as an
// infrastructure provider hands a machine its bootstrap data: a FAT file
// system labelled CIDATA holding user-data (the data as given: a Cluster
// API bootstrap data Secret's value, docs/capi.md) and meta-data
// (instance-id and local-hostname), which cloud-init's NoCloud datasource
// reads from any disk with that label (cloud-init's docs, "NoCloud";
// the node image enables it, docs/image.md). It runs mkfs.vfat
// (dosfstools) and mcopy (mtools); a seed left from an earlier call is
// replaced.
func writeNoCloudSeed(ctx context.Context, path string, userData []byte, instanceID, hostname string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	meta := fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", instanceID, hostname)
	files := []struct {
		name string
		data []byte
	}{{"user-data", userData}, {"meta-data", []byte(meta)}}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return err
		}
	}
	// Made aside and renamed: a half-written seed never has the name.
	tmp := filepath.Join(dir, "seed.img")
	// 2 MiB: mkfs.vfat's smallest FAT12 file system with room to spare
	// (cloud-init data of a machine is kilobytes); -C creates the file,
	// sized in KiB blocks.
	if out, err := exec.CommandContext(ctx, "mkfs.vfat", "-C", "-n", "CIDATA", tmp, "2048").CombinedOutput(); err != nil {
		return fmt.Errorf("making the NoCloud seed: mkfs.vfat (dosfstools): %w: %s", err, out)
	}
	for _, f := range files {
		cmd := exec.CommandContext(ctx, "mcopy", "-i", tmp, filepath.Join(dir, f.name), "::"+f.name)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("making the NoCloud seed: mcopy (mtools) %s: %w: %s", f.name, err, out)
		}
	}
	return os.Rename(tmp, path)
}
