// Package qemu boots a Gatehouse node image as a virtual machine, the way
// a cloud or a server boots it: QEMU's q35 machine with UEFI firmware
// (OVMF), a TPM 2.0 (swtpm, manufactured with an endorsement key
// certificate from the local manufacturer CA), the image as a disk the VM
// cannot change, a state disk of its own, a serial console the caller
// reads as lines, and TCP ports forwarded to this machine's loopback. The
// firmware measures the boot into the TPM, so the VM's evidence is that of
// a real measured boot (docs/image.md).
//
// It uses KVM where /dev/kvm is usable and software emulation (TCG)
// elsewhere; under TCG the firmware's start alone takes about a minute on
// a busy machine. Every process it starts dies with the caller's process
// and when the context given to Start ends.
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// VM is a running virtual machine. Its methods are safe for concurrent
// use.
type VM struct {
	cfg     Config
	accel   Accel
	ports   []Forward
	qemu    *process
	tpm     *process
	qmp     *qmp
	console *console
	log     *slog.Logger
	stages  []bootStage

	hostReset chan struct{} // receives QEMU's RESET event for a reset Reset asked for

	stopOnce    sync.Once
	stopErr     error
	ended       chan struct{} // closed once QEMU and swtpm ended and the console was read
	releaseOnce sync.Once
	released    chan struct{} // closed by Release
}

// ErrExited is returned (wrapped, with QEMU's last words) by calls that
// need a running VM after QEMU ended: the guest powered off, QEMU failed,
// or Stop was called.
var ErrExited = errors.New("the VM is not running")

// Start boots a VM as cfg describes and returns once QEMU runs; the guest
// then boots on its own (WaitForLine follows it). ctx bounds the VM's
// life: when it ends, QEMU and swtpm are killed. Errors name the step
// that failed; a Start that fails leaves nothing running.
//
// Under TCG the firmware takes about a minute before it hands over to the
// image's boot loader; the log says what the boot waits for.
func Start(ctx context.Context, cfg Config) (*VM, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	bins, err := lookPrograms()
	if err != nil {
		return nil, err
	}
	accel, why, err := chooseAccel(cfg.Accel)
	if err != nil {
		return nil, err
	}
	log := cfg.Log
	log.Info("Accelerator", "accel", string(accel), "why", why)
	if err := os.MkdirAll(filepath.Join(cfg.Dir, tpmDir), 0o700); err != nil {
		return nil, fmt.Errorf("creating the VM directory: %w", err)
	}
	if err := prepareDisks(ctx, bins[qemuImg], cfg); err != nil {
		return nil, err
	}
	ports, err := choosePorts(cfg.Forwards)
	if err != nil {
		return nil, err
	}
	tpm, err := startTPM(ctx, bins[swtpmBin], cfg.Dir, cfg.TPMCA, cfg.Detach, log)
	if err != nil {
		return nil, err
	}
	v := &VM{cfg: cfg, accel: accel, ports: ports, tpm: tpm, log: log, stages: bootStages(),
		hostReset: make(chan struct{}, 1), ended: make(chan struct{}), released: make(chan struct{})}
	if err := v.startQEMU(ctx, bins[qemuSystem]); err != nil {
		tpm.kill()
		return nil, err
	}
	watchCtx := ctx
	if cfg.Detach {
		// Start's context bounded the start; the VM lives on.
		watchCtx = context.WithoutCancel(ctx)
	}
	go v.watch(watchCtx)
	return v, nil
}

// prepareDisks makes the VM's private firmware variables (on its first
// start), a fresh overlay over the image, and the state disk when it is
// missing.
func prepareDisks(ctx context.Context, qemuImgBin string, cfg Config) error {
	vars := filepath.Join(cfg.Dir, varsFile)
	if _, err := os.Stat(vars); errors.Is(err, os.ErrNotExist) {
		data, err := os.ReadFile(cfg.Firmware.Vars)
		if err != nil {
			return fmt.Errorf("reading the firmware's variable store template: %w", err)
		}
		if err := os.WriteFile(vars, data, 0o600); err != nil { //nolint:gosec // the VM directory its caller chose
			return fmt.Errorf("copying the firmware's variable store: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("the firmware's variable store: %w", err)
	}
	overlay := filepath.Join(cfg.Dir, overlayFile)
	if err := os.Remove(overlay); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the previous image overlay: %w", err)
	}
	if out, err := exec.CommandContext(ctx, qemuImgBin, "create", "-q", "-f", "qcow2",
		"-b", cfg.Image, "-F", "raw", overlay).CombinedOutput(); err != nil {
		return fmt.Errorf("creating an overlay over the image %s: %w: %s", cfg.Image, err, strings.TrimSpace(string(out)))
	}
	if _, err := os.Stat(cfg.StateDisk); errors.Is(err, os.ErrNotExist) {
		f, err := os.OpenFile(cfg.StateDisk, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("creating the state disk: %w", err)
		}
		err = f.Truncate(cfg.StateDiskSize)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("creating the state disk: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("the state disk: %w", err)
	}
	return nil
}

// startQEMU starts QEMU, connects to its QMP socket and starts following
// the console.
func (v *VM) startQEMU(ctx context.Context, bin string) error {
	cfg := v.cfg
	for _, f := range []string{qmpSocket, consoleFile} {
		if err := os.Remove(filepath.Join(cfg.Dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing the previous run's %s: %w", f, err)
		}
	}
	start := time.Now()
	p, err := startProcess("QEMU", filepath.Join(cfg.Dir, qemuLogFile), cfg.Detach, bin, qemuArgs(cfg, v.accel, v.ports)...)
	if err != nil {
		return err
	}
	v.qemu = p
	v.console, err = newConsole(filepath.Join(cfg.Dir, consoleFile), start, v.progress)
	if err != nil {
		p.kill()
		return err
	}
	v.qmp, err = dialQMP(ctx, filepath.Join(cfg.Dir, qmpSocket), p, v.onEvent)
	if err != nil {
		p.kill()
		v.console.end()
		return fmt.Errorf("%w%s", err, v.qemuLogTail())
	}
	v.log.Info("OVMF starting"+v.firmwareEstimate(), "pid", p.cmd.Process.Pid, "dir", cfg.Dir)
	return nil
}

// qemuArgs returns QEMU's command line for cfg.
func qemuArgs(cfg Config, accel Accel, ports []Forward) []string {
	cpu := "max"
	if accel == AccelKVM {
		cpu = "host"
	}
	netdev := "user,id=net0"
	for _, f := range ports {
		netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", f.Host, f.Guest)
	}
	if cfg.Tap != "" {
		netdev = "tap,id=net0,ifname=" + cfg.Tap + ",script=no,downscript=no"
	}
	nic := "virtio-net-pci,netdev=net0,romfile="
	if cfg.MAC != "" {
		nic += ",mac=" + cfg.MAC
	}
	dir := cfg.Dir
	args := []string{
		"-name", "gatehouse-node",
		"-machine", "q35",
		"-accel", accelOption(accel),
		"-cpu", cpu,
		"-smp", strconv.Itoa(cfg.CPUs),
		"-m", strconv.Itoa(cfg.MemoryMiB),
		"-nodefaults", "-no-user-config", "-display", "none",
		// UEFI: read-only code, the VM's own variable store.
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + cfg.Firmware.Code,
		"-drive", "if=pflash,format=raw,unit=1,file=" + filepath.Join(dir, varsFile),
		// The image through its overlay, booted first; the state disk.
		"-drive", "if=none,id=os,format=qcow2,file=" + filepath.Join(dir, overlayFile),
		"-device", "virtio-blk-pci,drive=os,bootindex=0",
		"-drive", "if=none,id=state,format=raw,file=" + cfg.StateDisk,
		"-device", "virtio-blk-pci,drive=state,serial=" + stateDiskSerial,
		// The TPM: swtpm behind QEMU's emulator backend, a CRB interface.
		"-chardev", "socket,id=chrtpm,path=" + filepath.Join(dir, tpmCtrlSocket),
		"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
		"-device", "tpm-crb,tpmdev=tpm0",
		// The serial console into a file.
		"-chardev", "file,id=console,path=" + filepath.Join(dir, consoleFile),
		"-serial", "chardev:console",
		// User-mode network with the forwards; no option ROM, so the
		// firmware does not try to boot from the network.
		"-netdev", netdev,
		"-device", nic,
		"-device", "virtio-rng-pci",
		"-qmp", "unix:" + filepath.Join(dir, qmpSocket) + ",server=on,wait=off",
	}
	for i, d := range cfg.Drives {
		format := d.Format
		if format == "" {
			format = "raw"
		}
		drive := fmt.Sprintf("if=none,id=drive%d,format=%s,file=%s", i, format, d.File)
		if d.ReadOnly {
			drive += ",readonly=on"
		}
		dev := fmt.Sprintf("virtio-blk-pci,drive=drive%d", i)
		if d.Serial != "" {
			dev += ",serial=" + d.Serial
		}
		args = append(args, "-drive", drive, "-device", dev)
	}
	for _, e := range cfg.FWCfg {
		args = append(args, "-fw_cfg", "name="+e.Name+",file="+e.File)
	}
	return args
}

// tcgCacheMiB is TCG's translation cache in MiB. QEMU's default under
// TCG is 1 GiB, which doubled a 1 GiB VM's resident memory on the host
// (1.9 GiB measured for a VM node of the node image); a quarter of it
// holds a node's hot code.
const tcgCacheMiB = 256

// accelOption is QEMU's -accel option for accel.
func accelOption(accel Accel) string {
	if accel == AccelTCG {
		return fmt.Sprintf("tcg,tb-size=%d", tcgCacheMiB)
	}
	return string(accel)
}

// firmwareEstimate says how long the firmware's start takes under the
// accelerator.
func (v *VM) firmwareEstimate() string {
	if v.accel == AccelTCG {
		return " (about a minute under TCG)"
	}
	return " (seconds under KVM)"
}

// bootStage is a progress marker on the console and what it says about
// the boot.
type bootStage struct {
	pattern *regexp.Regexp
	message string
}

// bootStages are the markers of OVMF, Linux, systemd and the node image's
// bootstrapper unit that the log reports.
func bootStages() []bootStage {
	return []bootStage{
		{regexp.MustCompile(`^BdsDxe: starting `), "Firmware handed over to the boot loader; kernel booting"},
		{regexp.MustCompile(`^\[ *[0-9.]+\] Run .* as init process`), "Kernel started init"},
		{regexp.MustCompile(`^Welcome to .*!$`), "systemd started"},
		{regexp.MustCompile(`systemd\[1\]: Started gatehouse-bootstrapper\.service`), "The Gatehouse bootstrapper started"},
		{regexp.MustCompile(`^\[ *[0-9.]+\] systemd\[1\]: Switching root`), "Initrd done: switching to the root file system"},
	}
}

// progress logs the boot stages it sees in new console lines.
func (v *VM) progress(lines []Line) {
	for _, l := range lines {
		for _, s := range v.stages {
			if s.pattern.MatchString(l.Text) {
				v.log.Info(s.message, "boot", l.Boot, "after", l.At.Round(100*time.Millisecond).String())
			}
		}
	}
}

// onEvent handles QMP events: a reset the guest made begins a new boot.
func (v *VM) onEvent(name string, data json.RawMessage) {
	if name != "RESET" {
		return
	}
	var reset struct {
		Guest  bool   `json:"guest"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(data, &reset); err != nil {
		return
	}
	if !reset.Guest {
		// Reset asked for it and records the boot exactly.
		select {
		case v.hostReset <- struct{}{}:
		default:
		}
		return
	}
	size, err := v.console.size()
	if err != nil {
		return
	}
	boot := v.console.newBoot(size, time.Now())
	v.log.Info("The guest reset the VM: OVMF starting"+v.firmwareEstimate(), "boot", boot, "reason", reset.Reason)
}

// watch follows the console until QEMU ends, kills QEMU when ctx ends,
// and stops swtpm once QEMU is gone.
func (v *VM) watch(ctx context.Context) {
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	for running := true; running; {
		select {
		case <-ticker.C:
			_ = v.console.poll()
		case <-ctx.Done():
			v.log.Info("Killing the VM: its context ended", "error", ctx.Err())
			v.qemu.kill()
			running = false
		case <-v.qemu.done:
			running = false
		case <-v.released:
			v.qmp.close()
			v.console.end()
			return
		}
	}
	<-v.qemu.done
	v.tpm.stop(5 * time.Second)
	v.qmp.close()
	v.console.end()
	close(v.ended)
}
