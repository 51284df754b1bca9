package qemu

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
)

// Config describes one VM. Image and TPMCA are required; every other field
// has a default.
type Config struct {
	// Image is the node image: a raw GPT disk with an EFI system partition
	// (docs/image.md). The VM boots it as its first virtio disk through a
	// qcow2 overlay in Dir, made anew by every Start, so the VM never
	// changes the image and every Start boots it as built.
	Image string
	// Dir is the VM's directory: its firmware variables, TPM state, state
	// disk (unless StateDisk names another), sockets, console log and QEMU's
	// log. It is created if missing and reused if present: a VM started
	// again on the same Dir has the same TPM (same endorsement key), the
	// same firmware variables and the same state disk, as a machine that
	// is switched off and on again. Required.
	Dir string
	// StateDisk is the node's state disk: a raw file, created (sparse) with
	// StateDiskSize bytes when missing, attached as the second virtio disk
	// with serial "gatehouse-state", so the guest finds it as
	// /dev/disk/by-id/virtio-gatehouse-state. Empty means Dir/state.raw.
	StateDisk string
	// StateDiskSize is the size in bytes of a state disk that has to be
	// created; an existing one keeps its size. Zero means 4 GiB.
	StateDiskSize int64
	// MemoryMiB is the guest's memory in MiB; zero means 2048.
	MemoryMiB int
	// CPUs is the guest's number of virtual CPUs; zero means 2.
	CPUs int
	// Accel selects the accelerator; AccelAuto (the zero value) takes KVM
	// when it is usable (/dev/kvm opens and the CPU shows vmx or svm) and
	// TCG otherwise.
	Accel Accel
	// Forwards are the TCP ports of the guest reachable from this machine:
	// QEMU's user-mode network forwards 127.0.0.1:Host to the guest's
	// Guest port (loopback only). A zero Host port is replaced by a free
	// one; VM.Ports tells which.
	Forwards []Forward
	// TPMCA is the TPM manufacturer's CA that certifies the VM's TPM's
	// endorsement key when Start makes the TPM (the first Start on Dir):
	// what a verifier configures as the manufacturer's trust anchor.
	TPMCA swtpm.LocalCA
	// Firmware is the UEFI firmware; the zero value means Debian's OVMF
	// for 4 MiB flash (package ovmf), without Secure Boot enforced: it
	// measures the boot into the TPM (TCG PC Client Platform Firmware
	// Profile) and boots \EFI\BOOT\BOOTX64.EFI from the image's EFI system
	// partition.
	Firmware Firmware
	// Tap, when set, connects the VM's network card to this existing tap
	// device (its creator put it on a bridge: the VM is a machine on that
	// bridge's network) instead of QEMU's user-mode network; Forwards
	// must then be empty. The guest gets no address by DHCP there: give
	// it one through provisioning (FWCfg, docs/image.md "Provisioning").
	Tap string
	// MAC is the network card's MAC address (aa:bb:cc:dd:ee:ff, a locally
	// administered unicast one); empty means QEMU's default. VMs on one
	// bridge need different ones (MACFromName derives one from a name).
	MAC string
	// FWCfg are files the guest reads through QEMU's fw_cfg device
	// (/sys/firmware/qemu_fw_cfg/by_name/NAME/raw): how the node image is
	// provisioned (docs/image.md, "Provisioning": names
	// opt/gatehouse/...). Names start with "opt/".
	FWCfg []FWCfgEntry
	// Drives are more disks after the image and the state disk, in order
	// (a NoCloud seed for cloud-init, a data disk).
	Drives []Drive
	// Detach makes QEMU and swtpm outlive the caller: they run in a
	// session of their own, are not killed when the caller's process or
	// Start's context ends, and another process reaches the VM through
	// its directory (ResetDir, PowerOffDir) and ends it by its PIDs
	// (VM.PIDs). Release lets a detached VM go without stopping it.
	Detach bool
	// Log receives progress ("OVMF starting", "kernel booting", …) and the
	// lifecycle; nil discards it.
	Log *slog.Logger
}

// FWCfgEntry is one fw_cfg file: the guest reads File's content as Name.
type FWCfgEntry struct {
	// Name is the entry's name, "opt/..." (QEMU reserves the others), at
	// most 55 bytes.
	Name string
	// File is the file on this machine whose content the guest reads.
	File string
}

// Drive is a disk of the VM besides the image and the state disk: a
// virtio disk.
type Drive struct {
	// File is the disk's file on this machine.
	File string
	// Format is QEMU's format name of File: "raw" (the default) or
	// "qcow2".
	Format string
	// ReadOnly makes the disk read-only for the guest.
	ReadOnly bool
	// Serial is the disk's virtio serial number (the guest's
	// /dev/disk/by-id/virtio-<Serial>); empty means none.
	Serial string
}

// Forward is one forwarded TCP port: 127.0.0.1:Host on this machine
// reaches port Guest of the VM.
type Forward struct {
	Host  int
	Guest int
}

// Accel is QEMU's accelerator: "kvm" (hardware virtualisation) or "tcg"
// (software emulation, about a minute for OVMF's start on a busy machine).
type Accel string

// Accelerators.
const (
	AccelAuto Accel = ""
	AccelKVM  Accel = "kvm"
	AccelTCG  Accel = "tcg"
)

// ParseAccel parses "auto", "kvm" or "tcg" (what a --accel flag takes).
func ParseAccel(s string) (Accel, error) {
	switch s {
	case "", "auto":
		return AccelAuto, nil
	case string(AccelKVM), string(AccelTCG):
		return Accel(s), nil
	}
	return "", fmt.Errorf("unknown accelerator %q: use auto, kvm or tcg", s)
}

// Firmware is a UEFI firmware split into code and variable store, as
// OVMF is built for QEMU's two pflash devices.
type Firmware struct {
	// Code is the firmware's code, mapped read-only.
	Code string
	// Vars is the template of the variable store; each VM gets a private
	// copy in its Dir on its first Start (its NVRAM).
	Vars string
}

// Debian's OVMF for 4 MiB flash (package ovmf), Config.Firmware's default.
const (
	debianOVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	debianOVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// Defaults of Config.
const (
	defaultStateDiskSize = 4 << 30
	defaultMemoryMiB     = 2048
	defaultCPUs          = 2
)

// stateDiskSerial is the virtio serial number of the state disk; the guest
// sees the disk as /dev/disk/by-id/virtio-gatehouse-state.
const stateDiskSerial = "gatehouse-state"

// Files in Config.Dir.
const (
	varsFile      = "OVMF_VARS.fd"
	overlayFile   = "image.qcow2"
	stateFile     = "state.raw"
	tpmDir        = "tpm"
	tpmCtrlSocket = "tpm/ctrl.sock"
	qmpSocket     = "qmp.sock"
	consoleFile   = "console.log"
	qemuLogFile   = "qemu.log"
)

// maxSocketPath is the longest path a Unix socket may have on Linux
// (sun_path holds 108 bytes with the terminating NUL).
const maxSocketPath = 107

// withDefaults checks cfg and returns it with defaults filled in and
// paths made absolute (swtpm and QEMU need absolute paths).
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Image == "" {
		return cfg, errors.New("no image: name the node image (a raw GPT disk, e.g. from `gatehouse image build`)")
	}
	if cfg.Dir == "" {
		return cfg, errors.New("no VM directory (Config.Dir)")
	}
	if cfg.TPMCA.Dir == "" {
		return cfg, errors.New("no TPM manufacturer CA (Config.TPMCA): the VM's TPM needs an endorsement key certificate")
	}
	var err error
	paths := []*string{&cfg.Image, &cfg.Dir, &cfg.StateDisk, &cfg.TPMCA.Dir}
	cfg.FWCfg, cfg.Drives = slices.Clone(cfg.FWCfg), slices.Clone(cfg.Drives)
	for i := range cfg.FWCfg {
		paths = append(paths, &cfg.FWCfg[i].File)
	}
	for i := range cfg.Drives {
		paths = append(paths, &cfg.Drives[i].File)
	}
	for _, p := range paths {
		if *p == "" {
			continue
		}
		if *p, err = filepath.Abs(*p); err != nil {
			return cfg, err
		}
	}
	if info, err := os.Stat(cfg.Image); err != nil {
		return cfg, fmt.Errorf("node image: %w", err)
	} else if !info.Mode().IsRegular() {
		return cfg, fmt.Errorf("node image %s is not a regular file", cfg.Image)
	}
	if cfg.StateDisk == "" {
		cfg.StateDisk = filepath.Join(cfg.Dir, stateFile)
	}
	if cfg.StateDiskSize == 0 {
		cfg.StateDiskSize = defaultStateDiskSize
	}
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = defaultMemoryMiB
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = defaultCPUs
	}
	if cfg.StateDiskSize < 0 || cfg.MemoryMiB < 0 || cfg.CPUs < 0 {
		return cfg, fmt.Errorf("negative size: state disk %d bytes, memory %d MiB, %d CPUs", cfg.StateDiskSize, cfg.MemoryMiB, cfg.CPUs)
	}
	if cfg.Firmware == (Firmware{}) {
		cfg.Firmware = Firmware{Code: debianOVMFCode, Vars: debianOVMFVars}
	}
	for _, f := range []string{cfg.Firmware.Code, cfg.Firmware.Vars} {
		if _, err := os.Stat(f); err != nil {
			return cfg, fmt.Errorf("UEFI firmware: %w (install the Debian package ovmf)", err)
		}
	}
	seen := map[int]bool{}
	for _, f := range cfg.Forwards {
		if f.Guest < 1 || f.Guest > 65535 || f.Host < 0 || f.Host > 65535 {
			return cfg, fmt.Errorf("forward %d→%d: ports are 1 to 65535 (host 0: any free port)", f.Host, f.Guest)
		}
		if seen[f.Guest] {
			return cfg, fmt.Errorf("guest port %d is forwarded twice", f.Guest)
		}
		seen[f.Guest] = true
	}
	if err := cfg.checkDevices(); err != nil {
		return cfg, err
	}
	for _, s := range []string{tpmCtrlSocket, qmpSocket} {
		if p := filepath.Join(cfg.Dir, s); len(p) > maxSocketPath {
			return cfg, fmt.Errorf("the VM directory's path is too long for its Unix socket %s (%d bytes, at most %d): choose a shorter directory", p, len(p), maxSocketPath)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// Programs the runner starts.
const (
	qemuSystem = "qemu-system-x86_64"
	qemuImg    = "qemu-img"
	swtpmBin   = "swtpm"
)

// lookPrograms returns the absolute path of each program the runner starts
// (swtpm_setup too, which swtpm.Manufacture runs), or an error naming the
// Debian packages to install.
func lookPrograms() (map[string]string, error) {
	paths := map[string]string{}
	var missing []string
	for _, p := range []struct{ name, pkg string }{
		{qemuSystem, "qemu-system-x86"}, {qemuImg, "qemu-utils"}, {swtpmBin, "swtpm"}, {"swtpm_setup", "swtpm-tools"},
	} {
		path, err := exec.LookPath(p.name)
		if err != nil {
			missing = append(missing, p.name+" (Debian package "+p.pkg+")")
			continue
		}
		paths[p.name] = path
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("not found: %s", strings.Join(missing, ", "))
	}
	return paths, nil
}

// fwCfgName is what a fw_cfg entry may be called here: under opt/, of
// characters a QEMU option and a sysfs path take as they are.
var fwCfgName = regexp.MustCompile(`^opt/[A-Za-z0-9._/-]{1,51}$`)

// macAddress is a MAC address in QEMU's notation.
var macAddress = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)

// checkDevices checks the network card, the fw_cfg entries and the
// drives; a comma in a path would end QEMU's option early.
func (cfg Config) checkDevices() error {
	if cfg.Tap != "" {
		if len(cfg.Forwards) > 0 {
			return errors.New("forwards need QEMU's user-mode network: a VM on a tap device (Config.Tap) has none")
		}
		if len(cfg.Tap) > 15 || strings.ContainsAny(cfg.Tap, ",/ ") {
			return fmt.Errorf("tap device name %q: at most 15 characters, no comma, slash or space", cfg.Tap)
		}
	}
	if cfg.MAC != "" && !macAddress.MatchString(cfg.MAC) {
		return fmt.Errorf("MAC address %q: want six lower-case hex pairs separated by colons", cfg.MAC)
	}
	seen := map[string]bool{}
	for _, e := range cfg.FWCfg {
		if !fwCfgName.MatchString(e.Name) || strings.Contains(e.Name, "..") {
			return fmt.Errorf("fw_cfg entry %q: a name is opt/ and up to 51 letters, digits, '.', '_', '-' or '/'", e.Name)
		}
		if seen[e.Name] {
			return fmt.Errorf("fw_cfg entry %s is given twice", e.Name)
		}
		seen[e.Name] = true
		if info, err := os.Stat(e.File); err != nil {
			return fmt.Errorf("fw_cfg entry %s: %w", e.Name, err)
		} else if !info.Mode().IsRegular() {
			return fmt.Errorf("fw_cfg entry %s: %s is not a regular file", e.Name, e.File)
		}
	}
	for _, d := range cfg.Drives {
		if d.Format != "" && d.Format != "raw" && d.Format != "qcow2" {
			return fmt.Errorf("drive %s: format %q (raw or qcow2)", d.File, d.Format)
		}
		if strings.ContainsAny(d.Serial, ", ") || len(d.Serial) > 20 {
			return fmt.Errorf("drive %s: serial %q: at most 20 characters, no comma or space", d.File, d.Serial)
		}
		if _, err := os.Stat(d.File); err != nil {
			return fmt.Errorf("drive: %w", err)
		}
	}
	for _, p := range append([]string{cfg.Image, cfg.Dir, cfg.StateDisk}, cfg.paths()...) {
		if strings.Contains(p, ",") {
			return fmt.Errorf("path %q has a comma, which QEMU's options cannot take here", p)
		}
	}
	return nil
}

// paths are the files of the fw_cfg entries and drives.
func (cfg Config) paths() []string {
	var out []string
	for _, e := range cfg.FWCfg {
		out = append(out, e.File)
	}
	for _, d := range cfg.Drives {
		out = append(out, d.File)
	}
	return out
}

// MACFromName derives a stable, locally administered unicast MAC address
// from name (a node's name with its cluster), for Config.MAC: the same
// name gives the same address on every start, as a real card keeps its.
func MACFromName(name string) string {
	sum := sha256.Sum256([]byte(name))
	sum[0] = sum[0]&0xfc | 0x02 // locally administered, unicast
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3], sum[4], sum[5])
}
