package main

import (
	"flag"
	"slices"
	"strings"
	"testing"
	"time"

	// Imported for their side effect on the global flag set, as the
	// bootstrapper's own imports do: they register test flags there.
	_ "github.com/google/go-sev-guest/client"
	_ "github.com/google/go-tdx-guest/client"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// required are the flags every bootstrapper start needs.
var required = []string{"--advertise-address", "192.0.2.10", "--state-disk", "/dev/vdb"}

// TestLibraryTestFlagsAreRefused: go-sev-guest and go-tdx-guest register
// flags on Go's global flag set that point the guest device at another path
// (or a fake when testing); the bootstrapper parsed the global set and so
// accepted them. Its own flag set refuses them.
func TestLibraryTestFlagsAreRefused(t *testing.T) {
	for _, f := range []string{"sev_guest_device_path", "tdx_guest_device_path"} {
		if flag.CommandLine.Lookup(f) == nil {
			t.Fatalf("-%s is not registered globally any more: this test no longer shows what it refuses", f)
		}
		_, err := parseFlags("gatehouse-bootstrapper", append([]string{"-" + f + "=/tmp/fake"}, required...), "node-1")
		if err == nil || !strings.Contains(err.Error(), "flag provided but not defined: -"+f) {
			t.Errorf("-%s: %v, want it refused as undefined", f, err)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags("gatehouse-bootstrapper", append([]string{"--pcrs", "4,15", "--kube-proxy-conntrack-max-per-core", "0",
		"--join-endpoints", "10.0.0.1:9090,10.0.0.2:9090", "--skip-phases", "addon/coredns, ,",
		"--control-plane-env", "kube-apiserver:GOGC=50", "--control-plane-env", "etcd:GOMEMLIMIT=200MiB",
		// The node image's unit names its own checks, a deployment adds more.
		"--ignore-preflight-errors=FileExisting-crictl,SystemVerification", "--ignore-preflight-errors", "Mem",
		"--control-plane-wait", "15m", "--leader-election-lease", "1m"}, required...), "Node-1")
	if err != nil {
		t.Fatal(err)
	}
	if o.node.Name != "node-1" || o.node.AdvertiseAddress != "192.0.2.10" || o.stateDisk != "/dev/vdb" {
		t.Errorf("node %+v, state disk %q", o.node, o.stateDisk)
	}
	if len(o.attester.PCRs) != 2 || o.attester.Variant != "tpm" || o.attester.TPMPath != "/dev/tpmrm0" ||
		o.attester.TCGEventLog != "/sys/kernel/security/tpm0/binary_bios_measurements" {
		t.Errorf("attester options %+v", o.attester)
	}
	// The local cluster's swtpm nodes send no firmware log.
	none, err := parseFlags("gatehouse-bootstrapper", append([]string{"--tcg-event-log", ""}, required...), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if none.attester.TCGEventLog != "" {
		t.Errorf("--tcg-event-log \"\" gives %q", none.attester.TCGEventLog)
	}
	if o.kubeProxy.ConntrackMaxPerCore == nil || *o.kubeProxy.ConntrackMaxPerCore != 0 || o.endpoints == nil || len(o.skipPhases) != 1 {
		t.Errorf("kube-proxy %+v, endpoints %v, skip phases %q", o.kubeProxy, o.endpoints, o.skipPhases)
	}
	if o.controlPlaneWait != 15*time.Minute || o.leaderElectionLease != time.Minute {
		t.Errorf("control-plane wait %s, leader-election lease %s; want 15m and 1m", o.controlPlaneWait, o.leaderElectionLease)
	}
	if want := []string{"FileExisting-crictl", "SystemVerification", "Mem"}; !slices.Equal(o.node.IgnorePreflightErrors, want) {
		t.Errorf("ignored preflight errors %q, want %q", o.node.IgnorePreflightErrors, want)
	}
	if want := []kubeadm.ComponentEnv{{Component: "kube-apiserver", Name: "GOGC", Value: "50"}, {Component: "etcd", Name: "GOMEMLIMIT", Value: "200MiB"}}; !slices.Equal(o.controlPlaneEnv, want) {
		t.Errorf("control-plane env %+v, want %+v", o.controlPlaneEnv, want)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--state-disk", "/dev/vdb"}, "--advertise-address (unless --cloud gives it) and --state-disk are required"},
		{append([]string{"--pcrs", "4"}, required...), "--pcrs must include the node lock PCR 15"},
		{append([]string{"--join-backoff", "2m", "--join-backoff-max", "1m"}, required...), "--join-backoff 2m0s and --join-backoff-max 1m0s"},
		{append([]string{"--kubelet-service", "upstart"}, required...), `--kubelet-service "upstart"`},
		{append([]string{"--control-plane-env", "kube-apiserver:GODEBUG=x509sha1=1"}, required...), "only GOGC and GOMEMLIMIT"},
		{append([]string{"--control-plane-env", "etcd:GOGC=50", "--control-plane-env", "etcd:GOGC=60"}, required...), "GOGC of etcd is set twice"},
		{append([]string{"--control-plane-wait", "2h"}, required...), "--control-plane-wait: control-plane wait 2h0m0s is not between 0"},
		{append([]string{"--control-plane-wait", "-1m"}, required...), "--control-plane-wait: control-plane wait -1m0s"},
		{append([]string{"--leader-election-lease", "10m"}, required...), "--leader-election-lease: leader-election lease 10m0s is neither 0"},
	} {
		if _, err := parseFlags("gatehouse-bootstrapper", tt.args, "node-1"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}
