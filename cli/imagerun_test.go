package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/image/qemu"
)

func TestParseForwards(t *testing.T) {
	tests := []struct {
		in      []string
		want    []qemu.Forward
		wantErr bool
	}{
		{in: []string{"9000", "19001:9001"}, want: []qemu.Forward{{Host: 0, Guest: 9000}, {Host: 19001, Guest: 9001}}},
		{in: nil, want: nil},
		{in: []string{"ssh"}, wantErr: true},
		{in: []string{"1:2:3"}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseForwards(tt.in)
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
			t.Errorf("parseForwards(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestImageRunUntilTimesOut runs `gatehouse image run --until` on a blank
// disk, which prints nothing: the command fails after --timeout naming
// the expression, and leaves no process and no temporary directory.
func TestImageRunUntilTimesOut(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "swtpm", "swtpm_setup"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing: install qemu-system-x86, qemu-utils, ovmf, swtpm and swtpm-tools (hack/setup.sh --test)", tool)
			}
			t.Skipf("%s is missing", tool)
		}
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	image := filepath.Join(tmp, "blank.raw")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd := NewRootCmd()
	cmd.SetArgs([]string{"image", "run", "--until", "never printed", "--timeout", "3s", "--memory", "256", "--cpus", "1",
		"--tpm-ca", filepath.Join(tmp, "ca"), image})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	start := time.Now()
	err := cmd.ExecuteContext(t.Context())
	if err == nil || !strings.Contains(err.Error(), `waiting for "never printed" on the console`) {
		t.Fatalf("image run = %v, want the --until wait to time out; log:\n%s", err, errOut.String())
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("image run took %s to give up after a 3 s --timeout", d)
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "gatehouse-vm-") {
			t.Errorf("the temporary VM directory %s is left", e.Name())
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(tmp)) {
			t.Errorf("a process still refers to the test's directory: %s", bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
}
