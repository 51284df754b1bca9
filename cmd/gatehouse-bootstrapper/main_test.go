package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
)

// TestNewMachineFailsClosedWithoutDeviceMapper: a kernel without
// device-mapper cannot open the state disk. The bootstrapper used to keep
// the node's state on the root file system with a warning (fail open); it
// now refuses, and only --insecure-state-on-root-fs (the local
// network-namespace cluster) keeps the old behaviour.
func TestNewMachineFailsClosedWithoutDeviceMapper(t *testing.T) {
	noDM := func() (bool, string) { return false, "this kernel has no device-mapper (not in /proc/misc)" }
	withDM := func() (bool, string) { return true, "" }
	tests := []struct {
		name         string
		deviceMapper func() (bool, string)
		insecure     bool
		wantErr      string
		wantVolume   bool
		wantWarning  string
	}{
		{name: "without device-mapper the node is refused", deviceMapper: noDM, wantErr: "refusing to bootstrap: the node's state disk cannot be opened because this kernel has no device-mapper"},
		{name: "the refusal names the flag of the local cluster", deviceMapper: noDM, wantErr: "--insecure-state-on-root-fs"},
		{name: "the local cluster's flag keeps the state on the root file system", deviceMapper: noDM, insecure: true, wantWarning: "stays unencrypted on the root file system"},
		{name: "with device-mapper the state disk is opened", deviceMapper: withDM, wantVolume: true},
		{name: "with device-mapper the flag changes nothing", deviceMapper: withDM, insecure: true, wantVolume: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags("gatehouse-bootstrapper", required, "node-1")
			if err != nil {
				t.Fatal(err)
			}
			o.insecureStateOnRootFS = tt.insecure
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			m, err := newMachine(log, o, &statedisk.Disk{}, tt.deviceMapper)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				if m != nil {
					t.Fatal("a machine was returned beside the refusal")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := m.State != nil; got != tt.wantVolume {
				t.Errorf("state volume set = %t, want %t", got, tt.wantVolume)
			}
			if !strings.Contains(logs.String(), tt.wantWarning) {
				t.Errorf("log %q lacks %q", logs.String(), tt.wantWarning)
			}
		})
	}
}

// TestInsecureStateFlagParses: the flag is off unless given.
func TestInsecureStateFlagParses(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool
	}{{required, false}, {append([]string{"--insecure-state-on-root-fs"}, required...), true}} {
		o, err := parseFlags("gatehouse-bootstrapper", tt.args, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		if o.insecureStateOnRootFS != tt.want {
			t.Errorf("%v: insecureStateOnRootFS = %t, want %t", tt.args, o.insecureStateOnRootFS, tt.want)
		}
	}
}
