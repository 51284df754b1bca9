package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
)

// RebootNode power-cycles node name of the local cluster in dir through
// its provider (Provider.Reset): every process of the node stops (its pods
// too), its disks and directories stay, and it boots again. The TPM
// restarts from zero PCRs and the boot is measured again, so the node lock
// is free; the node's bootstrapper finds its state disk initialised and
// rejoins through the join service (attested), and its kubelet starts only
// once that succeeded. With tamper, the node measures a changed boot
// manifest from this boot on (recorded in its node.json; to see a rebooted
// node refused). It returns once the machine runs again; the rejoin goes
// on in the node.
func RebootNode(ctx context.Context, dir, name string, tamper bool, out io.Writer) error {
	return rebootNode(ctx, dir, name, tamper, out, providerFor)
}

// rebootNode is RebootNode with the providers providerFor returns.
func rebootNode(ctx context.Context, dir, name string, tamper bool, out io.Writer, providerFor providerLookup) error {
	rec, err := readCluster(dir)
	if err != nil {
		return err
	}
	n, err := readNode(rec, name, providerFor)
	if err != nil {
		return err
	}
	if tamper && len(n.spec.BootManifest) > 0 {
		n.spec.BootManifest[len(n.spec.BootManifest)-1] ^= 1
		if err := n.spec.write(); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "Stopping every process of %s and starting it again (%s): its TPM starts from zero PCRs and its boot is measured again; it rejoins through the join service\n", name, n.provider.Name())
	err = n.provider.Reset(ctx, n.spec, n.rec)
	if err := errors.Join(err, rec.save()); err != nil {
		return fmt.Errorf("rebooting %s: %w", name, err)
	}
	return nil
}

// Stop powers off every node of the local cluster in dir, as a power cut
// would: every process stops, disks and directories stay (Start boots
// them again).
func Stop(ctx context.Context, dir string, out io.Writer) error {
	return stop(ctx, dir, "", out, providerFor)
}

// StopNode powers off node name of the local cluster in dir, as Stop
// does every node; the cluster goes on without it. RebootNode boots it
// again.
func StopNode(ctx context.Context, dir, name string, out io.Writer) error {
	if name == "" {
		return errors.New("no node named to stop")
	}
	return stop(ctx, dir, name, out, providerFor)
}

// stop is Stop with the providers providerFor returns, of node only when
// it is not empty.
func stop(ctx context.Context, dir, node string, out io.Writer, providerFor providerLookup) error {
	rec, err := readCluster(dir)
	if err != nil {
		return err
	}
	if node != "" {
		if _, err := readNode(rec, node, providerFor); err != nil {
			return err
		}
	}
	var errs []error
	for i := len(rec.Nodes) - 1; i >= 0; i-- {
		nr := &rec.Nodes[i]
		if node != "" && nr.Name != node {
			continue
		}
		fmt.Fprintf(out, "Stopping %s\n", nr.Name)
		p, err := providerFor(rec, nr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, p.Stop(ctx, nr))
	}
	errs = append(errs, rec.save())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if node != "" {
		fmt.Fprintf(out, "%s is off. `gatehouse mini node reboot %s --dir %s` boots it again.\n", node, node, dir)
		return nil
	}
	fmt.Fprintf(out, "Every node is off. `gatehouse mini start --dir %s` boots them again.\n", dir)
	return nil
}

// vmRecoverTimeout is how long gatehouse recover waits for a VM control
// plane to answer (docs/benchmarks.md, "VM nodes": the boot to the
// bootstrapper takes 1.5-2 min under TCG on an idle machine).
const vmRecoverTimeout = "--timeout 15m"

// Start boots every node of the local cluster in dir after Stop. With
// every control plane down, no join service can unlock them: the control
// planes wait for `gatehouse recover` (the command is printed), and the
// workers rejoin by themselves once the join service runs again.
func Start(ctx context.Context, dir string, out io.Writer) error {
	return start(ctx, dir, out, providerFor)
}

// start is Start with the providers providerFor returns.
func start(ctx context.Context, dir string, out io.Writer, providerFor providerLookup) error {
	rec, err := readCluster(dir)
	if err != nil {
		return err
	}
	var nodes []*clusterNode
	for _, nr := range rec.Nodes {
		n, err := readNode(rec, nr.Name, providerFor)
		if err != nil {
			return err
		}
		if n.provider.Running(n.rec) {
			return fmt.Errorf("node %s runs: stop the cluster first (gatehouse mini stop)", n.rec.Name)
		}
		nodes = append(nodes, n)
	}
	var controlPlanes []string
	vmControlPlane := false
	for _, n := range nodes {
		fmt.Fprintf(out, "Booting %s\n", n.rec.Name)
		if err := bootNode(ctx, rec, n.provider, n.spec); err != nil {
			return err
		}
		if n.spec.ControlPlane {
			controlPlanes = append(controlPlanes, fmt.Sprintf("--endpoint %s:%d", n.spec.IP, initPort))
			vmControlPlane = vmControlPlane || n.provider.Name() == ProviderQEMU
		}
	}
	if vmControlPlane {
		// Firmware, kernel and containerd take minutes under TCG before
		// the bootstrapper answers; recover waits 2 by default.
		controlPlanes = append(controlPlanes, vmRecoverTimeout)
	}
	fmt.Fprintf(out, "Every node booted. The control planes wait to be recovered (docs/recovery.md):\n"+
		"  gatehouse recover --config %s --master-secret-file %s %s\n",
		filepath.Join(dir, clusterconfig.DefaultPath), filepath.Join(dir, clusterconfig.DefaultMasterSecretFile), strings.Join(controlPlanes, " "))
	return nil
}
