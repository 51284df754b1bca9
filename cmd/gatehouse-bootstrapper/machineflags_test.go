package main

import (
	"errors"
	"strings"
	"testing"
)

func TestRoleFromCmdline(t *testing.T) {
	tests := []struct {
		cmdline          string
		wantControlPlane bool
		wantErr          string
	}{
		{cmdline: "root=/dev/mapper/root ro gatehouse.role=controlPlane console=ttyS0\n", wantControlPlane: true},
		{cmdline: "gatehouse.role=worker", wantControlPlane: false},
		{cmdline: "root=/dev/vda1 ro", wantErr: "has no gatehouse.role= parameter"},
		{cmdline: "gatehouse.role=worker gatehouse.role=controlPlane", wantErr: "names gatehouse.role= 2 times (worker, controlPlane)"},
		{cmdline: "gatehouse.role=controlplane", wantErr: `gatehouse.role="controlplane" is no role`},
		{cmdline: "xgatehouse.role=controlPlane", wantErr: "has no gatehouse.role= parameter"},
	}
	for _, tt := range tests {
		t.Run(tt.cmdline, func(t *testing.T) {
			got, err := roleFromCmdline(tt.cmdline)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.wantControlPlane {
				t.Fatalf("= %t, %v; want %t", got, err, tt.wantControlPlane)
			}
		})
	}
}

func TestResolveFromMachine(t *testing.T) {
	cmdline := func(s string) func() ([]byte, error) { return func() ([]byte, error) { return []byte(s), nil } }
	route := func(addr string, err error) func() (string, error) {
		return func() (string, error) { return addr, err }
	}
	tests := []struct {
		name      string
		args      []string
		facts     machineFacts
		wantCP    bool
		wantAddr  string
		wantErr   string
		wantParse string
	}{
		{name: "role and address from the machine", args: []string{"--role-from-kernel-cmdline", "--advertise-address", "auto", "--state-disk", "/dev/vdb"},
			facts: machineFacts{cmdline: cmdline("gatehouse.role=controlPlane"), defaultRoute: route("10.0.2.15", nil)}, wantCP: true, wantAddr: "10.0.2.15"},
		{name: "flags given are kept", args: required, facts: machineFacts{}, wantAddr: "192.0.2.10"},
		{name: "a command line without a role is refused", args: append([]string{"--role-from-kernel-cmdline"}, required...),
			facts: machineFacts{cmdline: cmdline("ro")}, wantErr: "--role-from-kernel-cmdline: the kernel command line has no gatehouse.role="},
		{name: "no default route is refused", args: []string{"--advertise-address", "auto", "--state-disk", "/dev/vdb"},
			facts: machineFacts{defaultRoute: route("", errors.New("network is unreachable"))}, wantErr: "--advertise-address auto: network is unreachable"},
		{name: "both role flags are refused", args: append([]string{"--role-from-kernel-cmdline", "--control-plane"}, required...), wantParse: "give one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags("gatehouse-bootstrapper", tt.args, "node-1")
			if tt.wantParse != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantParse) {
					t.Fatalf("parse error = %v, want %q", err, tt.wantParse)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			err = resolveFromMachine(t.Context(), o, tt.facts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.controlPlane != tt.wantCP || o.node.AdvertiseAddress != tt.wantAddr {
				t.Errorf("controlPlane %t, address %q; want %t, %q", o.controlPlane, o.node.AdvertiseAddress, tt.wantCP, tt.wantAddr)
			}
		})
	}
}
