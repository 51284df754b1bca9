package mini

import (
	"context"
	"errors"
	"fmt"
)

// Provider makes and runs the machines a local cluster's nodes are, as
// kind's node providers do (docker, podman, nerdctl): Up, `mini node
// add|reboot`, Stop, Start, Status and Down reach a node's machine only
// through the provider its record names. A provider is told what to make
// by the node's NodeSpec (name, address on the cluster bridge, role,
// directory, TPM manufacturer CA) and writes what it made into the
// node's NodeRecord, which the caller saves after each call, also when
// the call fails: Delete must find everything that was made.
//
// The providers are netns (network and mount namespaces on the host: the
// default, fast, and its "reboot" restarts processes with a software TPM
// reset) and qemu (a VM of the node image, docs/image.md, with its own
// swtpm, tap on the cluster bridge and dm-crypt state disk: real firmware
// measurements, real reboots).
type Provider interface {
	// Name is how the record and the command line name the provider.
	Name() string
	// Create makes node s's machine, powered off: its attachment to the
	// cluster bridge at s.IP, its state disk, and its TPM with an EK
	// certificate from s.TPMCA. It records what it made in nr.
	Create(ctx context.Context, s *NodeSpec, nr *NodeRecord) error
	// Start powers the machine on: its TPM starts with PCRs from zero,
	// the boot is measured, and its bootstrapper starts (it inits, or
	// joins through s.JoinEndpoints). It returns once the machine runs,
	// not once it joined. It records the running processes in nr.
	Start(ctx context.Context, s *NodeSpec, nr *NodeRecord) error
	// Stop powers the machine off as a power cut would: every process of
	// the node ends; its disks and directory stay.
	Stop(ctx context.Context, nr *NodeRecord) error
	// Reset reboots a running machine the hard way (Stop, then Start, for
	// a provider without a reset line): PCRs start from zero.
	Reset(ctx context.Context, s *NodeSpec, nr *NodeRecord) error
	// Delete removes everything Create and Start made; what is already
	// gone is not an error.
	Delete(ctx context.Context, nr *NodeRecord) error
	// Exec runs argv on the node and returns its combined output;
	// ErrNoExec when the machine offers no way in (a node image has no
	// shell service, by design).
	Exec(ctx context.Context, nr *NodeRecord, argv ...string) ([]byte, error)
	// Logs names the files that say what the machine did (agent log,
	// serial console), for error messages and `mini status`.
	Logs(nr *NodeRecord) []string
	// Running reports whether the machine runs (is powered on): what
	// `mini status` shows, and what Up asks while it waits for a node's
	// bootstrapper to listen, to fail at once when the machine ended.
	Running(nr *NodeRecord) bool
	// StartsBeforeJoinData reports whether the machine may start before
	// the cluster is initialised: its bootstrapper then waits for the join
	// endpoints and the CA hash in its node.json (netns). A machine that
	// reads its provisioning once at boot (a VM's fw_cfg) reports false,
	// and Up starts it only once it knows them.
	StartsBeforeJoinData() bool
}

// ErrNoExec is what Provider.Exec returns for a machine that offers no
// way to run a command on it.
var ErrNoExec = errors.New("the node offers no way to run commands on it")

// Provider names.
const (
	ProviderNetNS = "netns"
	ProviderQEMU  = "qemu"
)

// providerConfig is what the providers are made from.
type providerConfig struct {
	// Network is the cluster's network.
	Network Network
	// Gatehouse is the gatehouse binary the agents of netns nodes run.
	Gatehouse string
	// NodeImage is the node image's directory (hack/node-image.sh prints
	// it; docs/image.md), which qemu nodes boot.
	NodeImage string
}

// newProvider returns the provider called name ("" is ProviderNetNS, the
// name records made before providers existed have). An unknown name is
// an error listing the known ones.
func newProvider(name string, c providerConfig) (Provider, error) {
	switch name {
	case ProviderNetNS, "":
		return &netnsProvider{gatehouse: c.Gatehouse, network: c.Network}, nil
	case ProviderQEMU:
		return qemuProvider(c)
	}
	return nil, fmt.Errorf("unknown node provider %q: the providers are %s and %s", name, ProviderNetNS, ProviderQEMU)
}

// qemuProvider is where the QEMU provider (qemu*.go) is wired in.
func qemuProvider(providerConfig) (Provider, error) {
	return nil, errors.New("the qemu node provider is not part of this build yet (issue 36): use --provider netns")
}
