package mini

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNoCloudSeed: the seed is a FAT file system labelled CIDATA whose
// user-data and meta-data hold what was given, and a second seed replaces
// the first.
func TestNoCloudSeed(t *testing.T) {
	for _, tool := range []string{"mkfs.vfat", "mcopy", "mtype", "blkid"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (make setup-test installs dosfstools, mtools, util-linux): %v", tool, err)
		}
	}
	path := filepath.Join(t.TempDir(), "seed.img")
	if err := writeNoCloudSeed(t.Context(), path, []byte("#cloud-config\nruncmd: [[false]]\n"), "i-0", "worker-0"); err != nil {
		t.Fatal(err)
	}
	if err := writeNoCloudSeed(t.Context(), path, []byte("#cloud-config\nruncmd: [[true]]\n"), "i-1", "worker-1"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "blkid", "-o", "export", path).CombinedOutput()
	if err != nil {
		t.Fatalf("blkid: %v: %s", err, out)
	}
	for _, want := range []string{"LABEL=CIDATA", "TYPE=vfat"} {
		if !slices.Contains(strings.Split(string(out), "\n"), want) {
			t.Errorf("blkid says %q, want a line %s", out, want)
		}
	}
	for name, want := range map[string]string{"user-data": "#cloud-config\nruncmd: [[true]]\n", "meta-data": "instance-id: i-1\nlocal-hostname: worker-1\n"} {
		got, err := exec.CommandContext(t.Context(), "mtype", "-i", path, "::"+name).Output()
		if err != nil || string(got) != want {
			t.Errorf("%s holds %q (%v), want %q", name, got, err, want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".seed-*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
