package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
)

// chooseAccel resolves want against this machine: AccelAuto becomes KVM
// when KVM is usable and TCG otherwise; AccelKVM fails when KVM is not
// usable. The reason says why, for the log.
func chooseAccel(want Accel) (Accel, string, error) {
	usable, why := kvmUsable("/dev/kvm", "/proc/cpuinfo")
	switch want {
	case AccelTCG:
		return AccelTCG, "TCG (software emulation) as asked", nil
	case AccelKVM:
		if !usable {
			return "", "", fmt.Errorf("KVM asked for but not usable: %s", why)
		}
		return AccelKVM, "KVM", nil
	case AccelAuto:
		if usable {
			return AccelKVM, "KVM", nil
		}
		return AccelTCG, "TCG (software emulation): " + why, nil
	}
	return "", "", fmt.Errorf("unknown accelerator %q: use auto, kvm or tcg", want)
}

// kvmUsable reports whether QEMU can use KVM here: the device opens for
// reading and writing, and the CPU advertises hardware virtualisation
// (the vmx or svm flag in cpuinfo). A /dev/kvm without the flag exists in
// some sandboxes and nested VMs, where QEMU starts but the guest fails
// on its first instructions, so the flag is required.
func kvmUsable(device, cpuinfo string) (bool, string) {
	f, err := os.OpenFile(device, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, device + " does not exist"
		}
		return false, fmt.Sprintf("%s does not open: %v", device, err)
	}
	_ = f.Close()
	info, err := os.ReadFile(cpuinfo)
	if err != nil {
		return false, fmt.Sprintf("reading %s: %v", cpuinfo, err)
	}
	for line := range bytes.Lines(info) {
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || string(bytes.TrimSpace(name)) != "flags" {
			continue
		}
		for _, flag := range bytes.Fields(value) {
			if string(flag) == "vmx" || string(flag) == "svm" {
				return true, ""
			}
		}
		break
	}
	return false, device + " exists but the CPU shows no vmx or svm flag (no nested virtualisation)"
}
