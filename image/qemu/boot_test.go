package qemu

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/saferwall/pe"

	"github.com/gatehouse-dev/gatehouse/image/predict/predicttest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
)

// requireTools stops the test when a tool (a name in PATH, or an absolute
// path, which need not be executable: firmware) is missing: under CI it
// fails naming the Debian package (predicttest.RequireTool).
func requireTools(t *testing.T, tools [][2]string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := os.Stat(tool[0]); err == nil && filepath.IsAbs(tool[0]) {
			continue
		}
		predicttest.RequireTool(t, tool[0], tool[1])
	}
}

// vmTools are what running a VM needs, with their Debian packages.
func vmTools() [][2]string {
	return [][2]string{
		{"qemu-system-x86_64", "qemu-system-x86"}, {"qemu-img", "qemu-utils"}, {debianOVMFCode, "ovmf"},
		{"swtpm", "swtpm"}, {"swtpm_setup", "swtpm-tools"},
	}
}

// bootTools are what building and booting the tiny UKI needs.
func bootTools() [][2]string {
	return append(vmTools(), [][2]string{
		{predicttest.Stub, "systemd-boot-efi"}, {predicttest.SystemdMeasure, "systemd"}, {"objcopy", "binutils"},
		{"sfdisk", "fdisk"}, {"mformat", "mtools"}, {"mmd", "mtools"}, {"mcopy", "mtools"},
		{"apt-get", "apt"}, {"apt-cache", "apt"}, {"dpkg-deb", "dpkg"},
	}...)
}

// TestBootMeasuresTheUKIAndResetStartsOver boots the tiny UKI under QEMU
// with OVMF and swtpm (slow: up to a minute per boot under TCG, three boots;
// it runs in `make test`, not with -short). It checks what the runner
// promises: the marker reaches the console, the state disk carries its
// serial, the firmware's event log replays to the PCRs and shows the UKI
// measured (PCR 4 its Authenticode digest, PCR 11 its sections as
// systemd-measure predicts, PCR 9 the initrd), a port forward reaches the
// guest, the image is unchanged, a reset boots again with PCRs from zero,
// so does the guest's own reboot, and Stop leaves no process.
func TestBootMeasuresTheUKIAndResetStartsOver(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM three times (minutes under TCG); runs without -short")
	}
	requireTools(t, bootTools())
	disk := buildTestDisk(t)
	imageSum := fileSHA256(t, disk.Disk)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()

	dir := t.TempDir()
	vm, err := Start(ctx, Config{
		Image: disk.Disk, Dir: dir, StateDiskSize: 64 << 20, MemoryMiB: 512,
		Forwards: []Forward{{Guest: testGuestPort}, {Guest: testRebootPort}},
		TPMCA:    swtpm.LocalCA{Dir: t.TempDir()},
		Log:      testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vm.Stop(context.Background()) })
	pids := vm.pids()

	first := waitBoot(ctx, t, vm)
	t.Logf("Boot 0 (%s): firmware handed over after %s, init marker after %s, ready after %s",
		vm.accel, first.handover, first.initStarted, first.ready)
	if got := first.disks["vdb"]; got != stateDiskSerial {
		lines, _, _ := vm.Console(0)
		for _, l := range lines {
			if strings.HasPrefix(l.Text, "DISK") {
				t.Logf("%q", l.Text)
			}
		}
		t.Errorf("the state disk (vdb) has serial %q, want %q", got, stateDiskSerial)
	}
	events := checkEventLog(t, first)
	checkUKIMeasured(t, disk, first, events)
	logEvents(t, events)
	keepEventLog(t, first, disk)

	ports := vm.Ports()
	if len(ports) != 2 || ports[0].Guest != testGuestPort || ports[0].Host == 0 || ports[1].Host == 0 {
		t.Fatalf("Ports() = %v, want guest ports %d and %d on chosen host ports", ports, testGuestPort, testRebootPort)
	}
	if got := readGreeting(ctx, t, ports[0].Host); got != testGreeting {
		t.Errorf("127.0.0.1:%d answered %q, want the guest's %q", ports[0].Host, got, testGreeting)
	}

	if err := vm.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	second := waitBoot(ctx, t, vm)
	t.Logf("Boot 1 after the reset: firmware handed over after %s, init marker after %s", second.handover, second.initStarted)
	if second.boot != first.boot+1 {
		t.Errorf("the boot after the reset is number %d, want %d", second.boot, first.boot+1)
	}
	// The event log of the second boot replays from zero to its PCRs: had
	// the reset kept the PCRs, they would hold both boots' measurements.
	checkEventLog(t, second)
	for _, pcr := range []int{4, 9, 11} {
		if !bytes.Equal(first.pcrs[pcr], second.pcrs[pcr]) {
			t.Errorf("PCR %d after the reset is %x, want %x as in the first boot", pcr, second.pcrs[pcr], first.pcrs[pcr])
		}
	}

	// The guest rebooting itself boots again too (QEMU runs without
	// -no-reboot), and its lines count as the next boot. The connection
	// stays open: user-mode networking drops a connection to the guest
	// whose host side closed before the guest accepted it.
	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1].Host)))
	if err != nil {
		t.Fatal(err)
	}
	rebootCtx, cancelReboot := context.WithTimeout(ctx, 3*time.Minute)
	waitForBootAfter(rebootCtx, t, vm, second.boot)
	cancelReboot()
	_ = conn.Close()
	third := waitBoot(ctx, t, vm)
	t.Logf("Boot 2 after the guest rebooted: firmware handed over after %s, init marker after %s", third.handover, third.initStarted)
	if third.boot != second.boot+1 {
		t.Errorf("the boot after the guest's reboot is number %d, want %d", third.boot, second.boot+1)
	}
	checkEventLog(t, third)

	if err := vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, pids, dir)
	if got := fileSHA256(t, disk.Disk); got != imageSum {
		t.Errorf("the image changed under the VM: SHA-256 %s, was %s", got, imageSum)
	}
	if _, err := vm.WaitForLine(ctx, regexp.MustCompile("never printed")); !errors.Is(err, ErrExited) {
		t.Errorf("WaitForLine after Stop: %v, want ErrExited", err)
	}
}

// bootResult is what the test init printed during one boot.
type bootResult struct {
	boot                         int
	handover, initStarted, ready time.Duration
	pcrs                         map[int][]byte
	disks                        map[string]string
	eventLog                     []byte
}

// waitBoot waits for the init's ready marker in the current boot and
// parses what the init printed before it.
func waitBoot(ctx context.Context, t *testing.T, vm *VM) bootResult {
	t.Helper()
	ready, err := vm.WaitForLine(ctx, regexp.MustCompile("^"+markerReady+"$"))
	if err != nil {
		t.Fatal(err)
	}
	r := bootResult{boot: ready.Boot, ready: ready.At, pcrs: map[int][]byte{}, disks: map[string]string{}}
	pcrLine := regexp.MustCompile(`^PCR ([0-9]+) ([0-9A-Fa-f]{64})$`)
	diskLine := regexp.MustCompile(`^DISK (vd[a-z]) serial=(.*)$`)
	var b64 strings.Builder
	inLog := false
	lines, _, _ := vm.Console(0)
	for _, l := range lines {
		if l.Boot != ready.Boot {
			continue
		}
		switch {
		case strings.HasPrefix(l.Text, "BdsDxe: starting "):
			r.handover = l.At
		case l.Text == markerStarted:
			r.initStarted = l.At
		case l.Text == markerLogBegin:
			inLog = true
		case l.Text == markerLogEnd:
			inLog = false
		case inLog:
			b64.WriteString(strings.TrimSpace(l.Text))
		}
		if m := pcrLine.FindStringSubmatch(l.Text); m != nil {
			n, _ := strconv.Atoi(m[1])
			r.pcrs[n], _ = hex.DecodeString(m[2])
		}
		if m := diskLine.FindStringSubmatch(l.Text); m != nil {
			r.disks[m[1]] = m[2]
		}
	}
	if r.eventLog, err = base64.StdEncoding.DecodeString(b64.String()); err != nil {
		t.Fatalf("the event log on the console of boot %d is no base64: %v", ready.Boot, err)
	}
	if len(r.pcrs) != 16 || len(r.eventLog) == 0 {
		t.Fatalf("boot %d printed %d PCRs and an event log of %d bytes", ready.Boot, len(r.pcrs), len(r.eventLog))
	}
	return r
}

// waitForBootAfter waits until the console has a line of a boot after
// boot.
func waitForBootAfter(ctx context.Context, t *testing.T, vm *VM, boot int) {
	t.Helper()
	next := 0
	for {
		lines, n, more := vm.Console(next)
		next = n
		for _, l := range lines {
			if l.Boot > boot {
				return
			}
		}
		select {
		case <-more:
		case <-vm.Done():
			t.Fatalf("the VM ended before boot %d", boot+1)
		case <-ctx.Done():
			t.Fatalf("no boot after boot %d: %v", boot, ctx.Err())
		}
	}
}

// checkEventLog replays the boot's event log against the PCRs the
// firmware and the stubs extend (0–9, 11; 10 is the kernel's IMA) and
// returns its events.
func checkEventLog(t *testing.T, r bootResult) []tcg.Event {
	t.Helper()
	var mrs []register.MR
	for _, i := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11} {
		mrs = append(mrs, register.PCR{Index: i, Digest: r.pcrs[i], DigestAlg: crypto.SHA256})
	}
	events, err := tcg.ParseAndReplay(r.eventLog, mrs, tcg.ParseOpts{})
	if err != nil {
		t.Fatalf("the event log of boot %d does not replay to its PCRs: %v", r.boot, err)
	}
	return events
}

// checkUKIMeasured finds the UKI in the boot's measurements.
func checkUKIMeasured(t *testing.T, d testDisk, r bootResult, events []tcg.Event) {
	t.Helper()
	// PCR 11: systemd-stub's sections, as systemd-measure predicts them
	// (no phase: the test init is no systemd).
	out, err := exec.Command(predicttest.SystemdMeasure, "calculate", "--linux="+d.Linux, "--osrel="+d.OSRel,
		"--cmdline="+d.Cmdline, "--initrd="+d.Initrd, "--bank=sha256", "--phase=").Output()
	if err != nil {
		t.Fatalf("systemd-measure: %v", err)
	}
	var want string
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "11:sha256="); ok {
			want = v
		}
	}
	if want == "" {
		t.Fatalf("systemd-measure printed no PCR 11: %q", out)
	}
	if got := hex.EncodeToString(r.pcrs[11]); got != want {
		t.Errorf("PCR 11 is %s, systemd-measure predicts %s", got, want)
	}
	digests := map[int][][]byte{}
	for _, e := range events {
		digests[e.Index] = append(digests[e.Index], e.Digest)
	}
	has := func(pcr int, digest []byte) bool {
		for _, d := range digests[pcr] {
			if bytes.Equal(d, digest) {
				return true
			}
		}
		return false
	}
	// PCR 4: the firmware measures the UKI's Authenticode digest when it
	// loads it; systemd-stub loads the kernel through the firmware too.
	for name, path := range map[string]string{"UKI": d.UKI, "kernel": d.Linux} {
		if digest := authenticode(t, path); !has(4, digest) {
			t.Errorf("PCR 4 has no event with the %s's Authenticode digest %x", name, digest)
		}
	}
	// PCR 9: the kernel's EFI stub measures the initrd it loaded.
	if digest := sha256.Sum256(readFile(t, d.Initrd)); !has(9, digest[:]) {
		t.Errorf("PCR 9 has no event with the initrd's digest %x", digest)
	}
	for _, f := range []string{d.Linux, d.OSRel, d.Cmdline, d.Initrd} {
		if digest := sha256.Sum256(readFile(t, f)); !has(11, digest[:]) {
			t.Errorf("PCR 11 has no event with the digest %x of %s", digest, f)
		}
	}
}

// authenticode returns a PE file's Authenticode SHA-256 digest, which
// UEFI firmware measures for an EFI application (TCG PC Client Platform
// Firmware Profile, EV_EFI_BOOT_SERVICES_APPLICATION).
func authenticode(t *testing.T, path string) []byte {
	t.Helper()
	f, err := pe.New(path, &pe.Options{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Parse(); err != nil {
		t.Fatalf("parsing %s as PE: %v", path, err)
	}
	return f.Authentihash()
}

// logEvents logs the events of PCRs 4, 9 and 11: type, description,
// digest.
func logEvents(t *testing.T, events []tcg.Event) {
	t.Helper()
	var b strings.Builder
	for _, e := range events {
		if e.Index != 4 && e.Index != 9 && e.Index != 11 {
			continue
		}
		fmt.Fprintf(&b, "\nPCR %2d %-32s %x %s", e.Index, e.Type.String(), e.Digest, describe(e))
	}
	t.Logf("Events of PCRs 4, 9, 11:%s", b.String())
}

// describe renders an event's data for the log: a tagged event's tag and
// text, an image load's file path, ASCII or UTF-16LE text, or its length.
func describe(e tcg.Event) string {
	switch e.Type {
	case tcg.EventTag:
		if tagged, err := tcg.ParseTaggedEventData(e.Data); err == nil {
			return fmt.Sprintf("tag %#x %s", tagged.ID, describeText(tagged.Data))
		}
	case tcg.EFIBootServicesApplication:
		if load, err := tcg.ParseEFIImageLoad(bytes.NewReader(e.Data)); err == nil {
			var path []string
			if elems, err := load.DevicePath(); err == nil {
				for _, el := range elems {
					path = append(path, fmt.Sprintf("%d/%d", el.Type, el.Subtype))
					if el.Type == 4 && el.Subtype == 4 { // media, file path
						path[len(path)-1] = describeText(el.Data)
					}
				}
			}
			return fmt.Sprintf("image of %d bytes, device path %s", load.Header.Length, strings.Join(path, " "))
		}
	}
	return describeText(e.Data)
}

// describeText renders ASCII or UTF-16LE text quoted, other data by its
// length.
func describeText(data []byte) string {
	trimmed := bytes.TrimRight(data, "\x00")
	ascii, utf16 := len(trimmed) > 0, len(trimmed) > 0
	var u []byte
	for i, c := range trimmed {
		if c < 0x20 || c > 0x7e {
			ascii = false
		}
		if i%2 == 1 && c != 0 {
			utf16 = false
		}
		if i%2 == 0 {
			u = append(u, c)
		}
	}
	switch {
	case ascii:
		return strconv.Quote(string(trimmed))
	case utf16 && bytes.IndexFunc(u, func(r rune) bool { return r < 0x20 || r > 0x7e }) < 0:
		return strconv.Quote(string(u)) + " (UTF-16)"
	}
	return fmt.Sprintf("(%d bytes of data)", len(data))
}

// keepEventLog writes the boot's raw event log and PCRs to the file
// $GATEHOUSE_QEMU_EVENTLOG names (and .pcrs beside it), for checking a
// PCR prediction against a real boot by hand.
func keepEventLog(t *testing.T, r bootResult, d testDisk) {
	t.Helper()
	out := os.Getenv("GATEHOUSE_QEMU_EVENTLOG")
	if out == "" {
		return
	}
	var pcrs strings.Builder
	for i := range 16 {
		fmt.Fprintf(&pcrs, "%d: %x\n", i, r.pcrs[i])
	}
	writeFile(t, out, string(r.eventLog))
	writeFile(t, out+".pcrs", pcrs.String())
	t.Logf("Kept the event log in %s and the PCRs in %s.pcrs; the UKI and its sections are in %s", out, out, filepath.Dir(d.UKI))
}

// readGreeting connects to the forwarded port and returns the guest's
// first line, retrying while the guest's listener is not up yet.
func readGreeting(ctx context.Context, t *testing.T, port int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			data, _ := io.ReadAll(conn)
			_ = conn.Close()
			// User-mode networking accepts before the guest does; an
			// empty answer means the guest did not listen yet.
			if s := strings.TrimSpace(string(data)); s != "" {
				return s
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no answer on 127.0.0.1:%d: %v", port, ctx.Err())
		case <-ticker.C:
		}
	}
}

// checkNothingLeft asserts that the VM's processes have ended and that
// no process refers to the VM's directory.
func checkNothingLeft(t *testing.T, pids []int, dir string) {
	t.Helper()
	for _, pid := range pids {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("process %d of the VM is still there after Stop", pid)
		}
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmdline, []byte(dir)) {
			t.Errorf("process %s still refers to the VM directory: %s", p.Name(), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
}

// testLogger logs into the test's log until the test ends.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, nil))
}

type testWriter struct {
	mu     sync.Mutex
	t      *testing.T
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}
