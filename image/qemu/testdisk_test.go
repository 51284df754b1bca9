package qemu

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cavaliergopher/cpio"

	"github.com/gatehouse-dev/gatehouse/image/predict/predicttest"
)

// The tiny boot the tests run before a real node image exists: Debian's
// cloud kernel, an initrd of Debian's static busybox whose init prints
// what the tests check, and systemd 252's stub, joined into a UKI
// (predicttest.BuildUKI) on a GPT disk's EFI system partition. Built once
// per content and cached under $GATEHOUSE_CACHE/qemu-test.

// Markers the test init prints.
const (
	markerStarted  = "GATEHOUSE-TEST-INIT-STARTED"
	markerReady    = "GATEHOUSE-TEST-READY"
	markerLogBegin = "GATEHOUSE-EVENTLOG-BEGIN"
	markerLogEnd   = "GATEHOUSE-EVENTLOG-END"
	testGuestPort  = 9000
	testGreeting   = "gatehouse-test"
	// A connection to testRebootPort makes the guest reboot itself.
	testRebootPort = 9001
)

// testModules are the kernel modules the init loads (with what they
// depend on): virtio PCI and its block and network drivers.
func testModules() []string { return []string{"virtio_pci", "virtio_blk", "virtio_net"} }

// testInit is the initrd's /init: it prints the markers, the disks'
// serial numbers, the SHA-256 PCRs and the firmware's event log (base64),
// brings up the network QEMU's user mode expects (10.0.2.15/24),
// reboots when a connection comes to testRebootPort, answers on
// testGuestPort, and prints the ready marker once both ports listen.
// It loads the modules listed in /lib/modules/order, in that order.
func testInit() string {
	return `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t securityfs securityfs /sys/kernel/security
mount -t devtmpfs devtmpfs /dev
dmesg -n 1
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m.ko; done
echo ` + markerStarted + `
for b in /sys/block/vd*; do echo "DISK $(basename $b) serial=$(cat $b/serial)"; done
for i in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do echo "PCR $i $(cat /sys/class/tpm/tpm0/pcr-sha256/$i)"; done
echo ` + markerLogBegin + `
base64 /sys/kernel/security/tpm0/binary_bios_measurements
echo ` + markerLogEnd + `
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
nc -l -p ` + fmt.Sprint(testRebootPort) + ` -e reboot -f &
(while true; do nc -l -p ` + fmt.Sprint(testGuestPort) + ` -e echo ` + testGreeting + `; done) &
# Ready only once both ports listen: the host connects right after the
# marker, and user-mode networking drops a connection the guest refused.
for p in ` + fmt.Sprintf("%04X %04X", testRebootPort, testGuestPort) + `; do
  until cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -qE ":$p [0-9A-F]+:0000 0A "; do sleep 1; done
done
echo ` + markerReady + `
wait
`
}

// testCmdline and testOSRelease are the UKI's .cmdline and .osrel.
const (
	testCmdline   = "console=ttyS0 panic=-1"
	testOSRelease = "ID=gatehouse-test\nNAME=\"Gatehouse test\"\n"
	// testDiskRecipe changes when the recipe below does, so that the
	// cache does not serve a disk built by an older one.
	testDiskRecipe = "tiny-uki-v5"
)

// testDisk is the built boot: the disk and the UKI's parts.
type testDisk struct {
	Disk, UKI, Linux, Initrd, Cmdline, OSRel string
}

// buildTestDisk returns the tiny boot's disk, building it when the cache
// holds none for the current packages.
func buildTestDisk(t *testing.T) testDisk {
	t.Helper()
	kernelPkg := debDependency(t, "linux-image-cloud-amd64")
	kernel := resolveDeb(t, kernelPkg)
	busybox := resolveDeb(t, "busybox-static")
	stub := fileSHA256(t, predicttest.Stub)
	key := sha256.Sum256([]byte(strings.Join([]string{testDiskRecipe, kernel.sha256, busybox.sha256, stub,
		testInit(), testCmdline, testOSRelease}, "\x00")))
	dir := filepath.Join(testCache(t), "uki-"+hex.EncodeToString(key[:8]))
	d := testDiskIn(dir)
	if _, err := os.Stat(d.Disk); err == nil {
		t.Logf("Tiny UKI disk from the cache: %s", dir)
		return d
	}
	t.Logf("Building the tiny UKI disk (%s, busybox %s) into %s", kernelPkg, busybox.version, dir)
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".build-*")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	x := t.TempDir()
	for _, deb := range []string{fetchDeb(t, kernel), fetchDeb(t, busybox)} {
		run(t, "dpkg-deb", "-x", deb, x)
	}
	vmlinuz, err := filepath.Glob(filepath.Join(x, "boot", "vmlinuz-*"))
	if err != nil || len(vmlinuz) != 1 {
		t.Fatalf("the kernel package holds %d vmlinuz files, want 1", len(vmlinuz))
	}
	modules, err := filepath.Glob(filepath.Join(x, "lib", "modules", "*", "kernel"))
	if err != nil || len(modules) != 1 {
		t.Fatalf("the kernel package holds %d module trees, want 1", len(modules))
	}
	predicttest.BuildUKI(t, tmp, "uki.efi", []predicttest.Section{
		{Name: ".osrel", Content: []byte(testOSRelease)},
		{Name: ".cmdline", Content: []byte(testCmdline)},
		{Name: ".linux", Content: readFile(t, vmlinuz[0])},
		{Name: ".initrd", Content: initrd(t, filepath.Join(x, "bin", "busybox"), modules[0])},
	})
	built := testDiskIn(tmp)
	buildESPDisk(t, built.Disk, built.UKI)
	if err := os.Rename(tmp, dir); err != nil {
		// A concurrent build may have won; its disk is as good.
		if _, serr := os.Stat(d.Disk); serr != nil {
			t.Fatal(err)
		}
	}
	return d
}

// testDiskIn names the files of a tiny boot in dir, as predicttest.BuildUKI
// names the UKI's sections.
func testDiskIn(dir string) testDisk {
	uki := filepath.Join(dir, "uki.efi")
	return testDisk{
		Disk: filepath.Join(dir, "disk.raw"), UKI: uki, Linux: uki + ".linux", Initrd: uki + ".initrd",
		Cmdline: uki + ".cmdline", OSRel: uki + ".osrel",
	}
}

// initrd returns an uncompressed newc cpio archive holding the init,
// busybox and the modules.
func initrd(t *testing.T, busybox, modules string) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	add := func(name string, mode cpio.FileMode, data []byte) {
		if err := w.WriteHeader(&cpio.Header{Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin", "dev", "proc", "sys", "lib", "lib/modules", "tmp"} {
		add(d, cpio.TypeDir|0o755, nil)
	}
	add("init", cpio.TypeReg|0o755, []byte(testInit()))
	add("bin/busybox", cpio.TypeReg|0o755, readFile(t, busybox))
	order := moduleLoadOrder(t, modules, testModules())
	for _, m := range order {
		add("lib/modules/"+moduleName(m)+".ko", cpio.TypeReg|0o644, readFile(t, m))
	}
	names := make([]string, len(order))
	for i, m := range order {
		names[i] = moduleName(m)
	}
	add("lib/modules/order", cpio.TypeReg|0o644, []byte(strings.Join(names, "\n")+"\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// moduleLoadOrder returns the files of the modules named and of the
// modules they depend on (the "depends" of their .modinfo section), each
// after its dependencies: Debian's packages ship no modules.dep, depmod
// makes it on installation.
func moduleLoadOrder(t *testing.T, tree string, names []string) []string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(tree, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".ko") {
			files[moduleName(path)] = path
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	state := map[string]int{} // 1: visiting, 2: done
	var visit func(name string)
	visit = func(name string) {
		switch state[name] {
		case 1:
			t.Fatalf("kernel modules depend on each other in a cycle through %s", name)
		case 2:
			return
		}
		state[name] = 1
		path, ok := files[name]
		if !ok {
			t.Fatalf("the kernel package has no module %s", name)
		}
		for _, dep := range moduleDepends(t, path) {
			visit(dep)
		}
		state[name] = 2
		order = append(order, path)
	}
	for _, n := range names {
		visit(n)
	}
	return order
}

// moduleDepends reads a module's dependencies from its .modinfo section
// (NUL-separated key=value strings).
func moduleDepends(t *testing.T, path string) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		t.Fatalf("%s has no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		t.Fatal(err)
	}
	for kv := range bytes.SplitSeq(data, []byte{0}) {
		if deps, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(deps) > 0 {
			return strings.Split(string(deps), ",")
		}
	}
	return nil
}

// moduleName is the name of a module file: its base name without .ko, with
// "-" as "_" (as the kernel names modules).
func moduleName(path string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(path), ".ko"), "-", "_")
}

// buildESPDisk makes a 64 MiB GPT disk whose one partition, an EFI system
// partition, holds uki as \EFI\BOOT\BOOTX64.EFI (the removable-media path
// firmware boots without boot entries, UEFI 2.10 §3.5.1).
func buildESPDisk(t *testing.T, disk, uki string) {
	t.Helper()
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sfdisk", "--quiet", disk)
	cmd.Stdin = strings.NewReader("label: gpt\nstart=2048, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=\"ESP\"\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v: %s", err, out)
	}
	esp := disk + "@@1M"
	run(t, "mformat", "-i", esp, "-F", "-v", "ESP", "::")
	run(t, "mmd", "-i", esp, "::/EFI", "::/EFI/BOOT")
	run(t, "mcopy", "-i", esp, uki, "::/EFI/BOOT/BOOTX64.EFI")
}

// deb is a Debian package as apt knows it.
type deb struct {
	name, version, sha256 string
}

// debDependency returns the package a metapackage depends on (the
// current kernel of linux-image-cloud-amd64).
func debDependency(t *testing.T, meta string) string {
	t.Helper()
	out := run(t, "apt-cache", "depends", meta)
	for line := range strings.Lines(out) {
		if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok {
			return strings.TrimSpace(dep)
		}
	}
	t.Fatalf("apt-cache names no dependency of %s (run apt-get update)", meta)
	return ""
}

// resolveDeb asks apt for the candidate version of name and its SHA-256.
func resolveDeb(t *testing.T, name string) deb {
	t.Helper()
	out := run(t, "apt-cache", "show", "--no-all-versions", name)
	d := deb{name: name}
	scanner := bufio.NewScanner(strings.NewReader(out))
	for scanner.Scan() {
		key, value, _ := strings.Cut(scanner.Text(), ": ")
		switch key {
		case "Version":
			d.version = value
		case "SHA256":
			d.sha256 = value
		}
	}
	if d.version == "" || d.sha256 == "" {
		t.Fatalf("apt-cache shows no version and SHA256 of %s (run apt-get update)", name)
	}
	return d
}

// fetchDeb returns the package file from the cache, downloading it with
// apt-get download when missing, checked against apt's SHA-256.
func fetchDeb(t *testing.T, d deb) string {
	t.Helper()
	dir := filepath.Join(testCache(t), "debs")
	path := filepath.Join(dir, d.sha256+".deb")
	if fileSHA256(t, path) == d.sha256 {
		return path
	}
	tmp := t.TempDir()
	t.Logf("Downloading %s %s", d.name, d.version)
	cmd := exec.Command("apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", d.name+"="+d.version)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apt-get download %s: %v: %s", d.name, err, out)
	}
	files, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(files) != 1 {
		t.Fatalf("apt-get download %s left %d files", d.name, len(files))
	}
	if got := fileSHA256(t, files[0]); got != d.sha256 {
		t.Fatalf("%s downloaded with SHA-256 %s, apt says %s", d.name, got, d.sha256)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Copy, not rename: the temporary directory may be on another file system.
	writeFile(t, path+".tmp", string(readFile(t, files[0])))
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	return path
}

// testCache is $GATEHOUSE_CACHE/qemu-test (the cache root defaults as in
// the Makefile).
func testCache(t *testing.T) string {
	t.Helper()
	root := os.Getenv("GATEHOUSE_CACHE")
	if root == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		root = filepath.Join(base, "gatehouse")
	}
	dir := filepath.Join(root, "qemu-test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// fileSHA256 returns the hex SHA-256 of a file, or "" when it is missing.
func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return ""
	} else if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
