package realboot

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// TestChangedCommandLineRefused: the control-plane disk with one character
// of its UKI's kernel command line changed boots (nothing on the machine
// checks it), but its evidence is refused, and the refusal names the
// .cmdline event of PCR 11 whose digest differs from the signed values.
func TestChangedCommandLineRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	work := t.TempDir()
	disk := filepath.Join(work, "node.raw")
	clustertest.ChangedCommandLine(t, r.image.ControlPlaneUKI, r.image.ControlPlaneDisk, disk)

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
	clustertest.RunTool(t, "cp", "--sparse=always", r.image.ControlPlaneDisk, disk)
	offset := clustertest.PartitionOffset(t, disk, clustertest.PartitionRoot)
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
