// Package predicttest builds unified kernel images (UKIs) for tests the way
// systemd 252 documents it (systemd-measure(1): objcopy adds the sections to
// Debian's systemd-stub), and finds the host tools the tests compare
// predictions with.
package predicttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Stub is Debian 12's systemd-stub (package systemd-boot-efi).
const Stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"

// SystemdMeasure is systemd 252's PCR 11 calculator (package systemd).
const SystemdMeasure = "/usr/lib/systemd/systemd-measure"

// sectionVMAs are the section addresses of systemd-measure(1)'s objcopy
// example (systemd 252).
var sectionVMAs = map[string]string{
	".osrel": "0x20000", ".cmdline": "0x30000", ".dtb": "0x40000", ".pcrsig": "0x80000",
	".pcrpkey": "0x90000", ".splash": "0x100000", ".linux": "0x2000000", ".initrd": "0x3000000",
}

// Section is one section to add to a UKI.
type Section struct {
	Name    string
	Content []byte
}

// Kernel returns a PE image to stand in for a kernel in a UKI's .linux
// section: systemd-stub itself. Prediction takes the kernel's Authenticode
// hash (the firmware measures the kernel systemd-stub loads); systemd-stub's
// PCR 11 measurement and systemd-measure take any bytes.
func Kernel(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile(RequireTool(t, Stub, "systemd-boot-efi"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// RequireTool returns the path of a host tool (a name looked up in PATH,
// or an absolute path). Without it the test fails under CI (CI set), naming
// the Debian package to install, and is skipped elsewhere.
func RequireTool(t testing.TB, tool, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(tool)
	if err == nil {
		return path
	}
	msg := tool + " not found: install the Debian package " + debianPackage + " (make setup does)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// BuildUKI writes each section's content to a file in dir and adds them to
// systemd-stub with objcopy (at systemd-measure(1)'s addresses, or
// one between 0x50000 and 0xf0000 for other names), returning the UKI's path in dir
// (named name) and the section files' paths by section name.
func BuildUKI(t testing.TB, dir, name string, sections []Section) (string, map[string]string) {
	t.Helper()
	objcopy := RequireTool(t, "objcopy", "binutils")
	RequireTool(t, Stub, "systemd-boot-efi")
	files := map[string]string{}
	var args []string
	for i, s := range sections {
		path := filepath.Join(dir, name+s.Name)
		if err := os.WriteFile(path, s.Content, 0o600); err != nil {
			t.Fatal(err)
		}
		files[s.Name] = path
		vma, ok := sectionVMAs[s.Name]
		if !ok {
			vma = "0x" + string("56789abcdef"[i%11]) + "0000"
		}
		args = append(args, "--add-section", s.Name+"="+path, "--change-section-vma", s.Name+"="+vma)
	}
	out := filepath.Join(dir, name)
	if output, err := exec.CommandContext(t.Context(), objcopy, append(args, Stub, out)...).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, output)
	}
	return out, files
}
