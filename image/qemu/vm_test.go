package qemu

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestProgressNamesBootStages(t *testing.T) {
	tests := []struct {
		line string
		want string // "" for none
	}{
		{`BdsDxe: starting Boot0001 "UEFI Misc Device" from PciRoot(0x0)/Pci(0x1,0x0)`, "Firmware handed over to the boot loader"},
		{`BdsDxe: loading Boot0001 "UEFI Misc Device"`, ""},
		{`[    4.067972] Run /init as init process`, "Kernel started init"},
		{`Welcome to Debian GNU/Linux 12 (bookworm)!`, "systemd started"},
		{`[  134.664881] systemd[1]: Started gatehouse-bootstrapper.service - Gatehouse bootstrapper.`, "The Gatehouse bootstrapper started"},
		{`[  OK  ] Started gatehouse-bootstra…vice - Gatehouse bootstrapper.`, ""},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		v := &VM{log: slog.New(slog.NewTextHandler(&buf, nil)), stages: bootStages()}
		v.progress([]Line{{Text: tt.line}})
		got := buf.String()
		if tt.want == "" && got != "" || tt.want != "" && (!strings.Contains(got, tt.want) || strings.Count(got, "\n") != 1) {
			t.Errorf("progress(%q) logged %q, want one message containing %q", tt.line, got, tt.want)
		}
	}
}
