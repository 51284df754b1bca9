package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
)

func TestConfigIsChecked(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "node.raw")
	if err := os.WriteFile(image, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	fw := Firmware{Code: image, Vars: image} // any files will do
	valid := func() Config {
		return Config{Image: image, Dir: filepath.Join(dir, "vm"), TPMCA: swtpm.LocalCA{Dir: filepath.Join(dir, "ca")}, Firmware: fw}
	}
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"no image", func(c *Config) { c.Image = "" }, "no image"},
		{"missing image", func(c *Config) { c.Image = filepath.Join(dir, "missing.raw") }, "node image: "},
		{"image is a directory", func(c *Config) { c.Image = dir }, "is not a regular file"},
		{"no directory", func(c *Config) { c.Dir = "" }, "no VM directory"},
		{"no TPM manufacturer", func(c *Config) { c.TPMCA = swtpm.LocalCA{} }, "no TPM manufacturer CA"},
		{"missing firmware", func(c *Config) { c.Firmware.Code = filepath.Join(dir, "missing.fd") }, "install the Debian package ovmf"},
		{"guest port zero", func(c *Config) { c.Forwards = []Forward{{Guest: 0}} }, "ports are 1 to 65535"},
		{"host port out of range", func(c *Config) { c.Forwards = []Forward{{Host: 70000, Guest: 22}} }, "ports are 1 to 65535"},
		{"guest port twice", func(c *Config) { c.Forwards = []Forward{{Guest: 9000}, {Guest: 9000}} }, "forwarded twice"},
		{"negative memory", func(c *Config) { c.MemoryMiB = -1 }, "negative size"},
		{"socket path too long", func(c *Config) { c.Dir = filepath.Join(dir, strings.Repeat("d", 100)) }, "too long for its Unix socket"},
		{"forwards on a tap", func(c *Config) { c.Tap, c.Forwards = "gh5-1h", []Forward{{Guest: 9000}} }, "a VM on a tap device"},
		{"tap name too long", func(c *Config) { c.Tap = "a-very-long-tap-name" }, "at most 15 characters"},
		{"malformed MAC", func(c *Config) { c.MAC = "02:00:00:00:00" }, "MAC address"},
		{"fw_cfg name outside opt/", func(c *Config) { c.FWCfg = []FWCfgEntry{{Name: "etc/boot-menu-wait", File: image}} }, "a name is opt/"},
		{"fw_cfg name with a comma", func(c *Config) { c.FWCfg = []FWCfgEntry{{Name: "opt/a,b", File: image}} }, "a name is opt/"},
		{"fw_cfg entry twice", func(c *Config) {
			c.FWCfg = []FWCfgEntry{{Name: "opt/gatehouse/network", File: image}, {Name: "opt/gatehouse/network", File: image}}
		}, "given twice"},
		{"fw_cfg file missing", func(c *Config) {
			c.FWCfg = []FWCfgEntry{{Name: "opt/gatehouse/network", File: filepath.Join(dir, "none")}}
		}, "fw_cfg entry opt/gatehouse/network"},
		{"drive format unknown", func(c *Config) { c.Drives = []Drive{{File: image, Format: "vmdk"}} }, "raw or qcow2"},
		{"drive serial with a comma", func(c *Config) { c.Drives = []Drive{{File: image, Serial: "a,b"}} }, "no comma"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.change(&cfg)
			_, err := cfg.withDefaults()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("withDefaults() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}

	t.Run("defaults", func(t *testing.T) {
		cfg, err := valid().withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.StateDisk != filepath.Join(dir, "vm", stateFile) || cfg.StateDiskSize != 4<<30 || cfg.MemoryMiB != 2048 || cfg.CPUs != 2 || cfg.Log == nil {
			t.Errorf("defaults not filled in: %+v", cfg)
		}
	})
}

func TestParseAccel(t *testing.T) {
	for in, want := range map[string]Accel{"": AccelAuto, "auto": AccelAuto, "kvm": AccelKVM, "tcg": AccelTCG} {
		if got, err := ParseAccel(in); err != nil || got != want {
			t.Errorf("ParseAccel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseAccel("hvf"); err == nil || !strings.Contains(err.Error(), "auto, kvm or tcg") {
		t.Errorf("ParseAccel(hvf) = %v, want an error listing the accelerators", err)
	}
}

func TestKVMUsable(t *testing.T) {
	dir := t.TempDir()
	device := filepath.Join(dir, "kvm")
	if err := os.WriteFile(device, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cpuinfo := func(flags string) string {
		p := filepath.Join(dir, "cpuinfo-"+strings.ReplaceAll(flags, " ", "_"))
		if err := os.WriteFile(p, []byte("processor\t: 0\nflags\t\t: "+flags+"\n\nprocessor\t: 1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name            string
		device, cpuinfo string
		want            bool
		why             string
	}{
		{"Intel VT-x", device, cpuinfo("fpu vme vmx sse"), true, ""},
		{"AMD-V", device, cpuinfo("fpu svm"), true, ""},
		{"no hardware virtualisation", device, cpuinfo("fpu sse hypervisor"), false, "no vmx or svm"},
		{"flag only in another field", device, cpuinfo("fpu") + "-missing", false, "reading"},
		{"no device", filepath.Join(dir, "missing"), cpuinfo("vmx"), false, "does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := kvmUsable(tt.device, tt.cpuinfo)
			if got != tt.want || !strings.Contains(why, tt.why) {
				t.Errorf("kvmUsable = %v, %q; want %v, containing %q", got, why, tt.want, tt.why)
			}
		})
	}
}

func TestQEMUArgs(t *testing.T) {
	cfg := Config{Dir: "/vm", StateDisk: "/vm/state.raw", CPUs: 2, MemoryMiB: 2048,
		Firmware: Firmware{Code: "/fw/CODE.fd", Vars: "/fw/VARS.fd"}}
	args := qemuArgs(cfg, AccelTCG, []Forward{{Host: 40000, Guest: 9000}, {Host: 40001, Guest: 9001}})
	joined := strings.Join(args, " ")
	for _, want := range []string{
		"-machine q35 -accel tcg,tb-size=256",
		"if=pflash,format=raw,unit=0,readonly=on,file=/fw/CODE.fd",
		"if=pflash,format=raw,unit=1,file=/vm/OVMF_VARS.fd",
		"format=qcow2,file=/vm/image.qcow2",
		"virtio-blk-pci,drive=os,bootindex=0",
		"virtio-blk-pci,drive=state,serial=gatehouse-state",
		"-tpmdev emulator,id=tpm0,chardev=chrtpm",
		"socket,id=chrtpm,path=/vm/tpm/ctrl.sock",
		"hostfwd=tcp:127.0.0.1:40000-:9000,hostfwd=tcp:127.0.0.1:40001-:9001",
		"-display none",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("QEMU's arguments lack %q:\n%s", want, joined)
		}
	}
	if slices.Contains(args, "-no-reboot") {
		t.Error("-no-reboot: a reset would end the VM instead of rebooting it")
	}
	if !strings.Contains(strings.Join(qemuArgs(cfg, AccelKVM, nil), " "), "-cpu host") {
		t.Error("under KVM the guest should see the host's CPU")
	}
}

func TestQEMUArgsTapFWCfgDrives(t *testing.T) {
	cfg := Config{Dir: "/vm", StateDisk: "/vm/state.raw", CPUs: 2, MemoryMiB: 1024,
		Firmware: Firmware{Code: "/fw/CODE.fd", Vars: "/fw/VARS.fd"},
		Tap:      "gh5-2h", MAC: MACFromName("gh5-worker-1"),
		FWCfg:  []FWCfgEntry{{Name: "opt/gatehouse/network", File: "/vm/provision/network"}},
		Drives: []Drive{{File: "/vm/seed.iso", ReadOnly: true, Serial: "cidata"}, {File: "/vm/data.qcow2", Format: "qcow2"}}}
	joined := strings.Join(qemuArgs(cfg, AccelTCG, nil), " ")
	for _, want := range []string{
		"-netdev tap,id=net0,ifname=gh5-2h,script=no,downscript=no",
		"virtio-net-pci,netdev=net0,romfile=,mac=" + cfg.MAC,
		"-fw_cfg name=opt/gatehouse/network,file=/vm/provision/network",
		"-drive if=none,id=drive0,format=raw,file=/vm/seed.iso,readonly=on -device virtio-blk-pci,drive=drive0,serial=cidata",
		"-drive if=none,id=drive1,format=qcow2,file=/vm/data.qcow2 -device virtio-blk-pci,drive=drive1",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("QEMU's arguments lack %q:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "user,id=net0") {
		t.Errorf("a VM on a tap device has QEMU's user-mode network too:\n%s", joined)
	}
}

func TestMACFromName(t *testing.T) {
	a, b := MACFromName("gh5-worker-1"), MACFromName("gh5-worker-2")
	if a == b || a != MACFromName("gh5-worker-1") {
		t.Fatalf("MACFromName: %s and %s; want stable and distinct", a, b)
	}
	if !macAddress.MatchString(a) || a[1] != '2' && a[1] != '6' && a[1] != 'a' && a[1] != 'e' {
		t.Fatalf("MACFromName = %s: want a locally administered unicast address", a)
	}
}
