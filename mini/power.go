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
	rec, err := readCluster(dir)
	if err != nil {
		return err
	}
	n, err := readNode(rec, name)
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
	rec, err := readCluster(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(rec.Nodes) - 1; i >= 0; i-- {
		nr := &rec.Nodes[i]
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
	fmt.Fprintf(out, "Every node is off. `gatehouse mini start --dir %s` boots them again.\n", dir)
	return nil
}

// Start boots every node of the local cluster in dir after Stop. With
// every control plane down, no join service can unlock them: the control
// planes wait for `gatehouse recover` (the command is printed), and the
// workers rejoin by themselves once the join service runs again.
func Start(ctx context.Context, dir string, out io.Writer) error {
	rec, err := readCluster(dir)
	if err != nil {
		return err
	}
	var nodes []*clusterNode
	for _, nr := range rec.Nodes {
		n, err := readNode(rec, nr.Name)
		if err != nil {
			return err
		}
		if n.provider.Running(n.rec) {
			return fmt.Errorf("node %s runs: stop the cluster first (gatehouse mini stop)", n.rec.Name)
		}
		nodes = append(nodes, n)
	}
	var controlPlanes []string
	for _, n := range nodes {
		fmt.Fprintf(out, "Booting %s\n", n.rec.Name)
		if err := bootNode(ctx, rec, n.provider, n.spec); err != nil {
			return err
		}
		if n.spec.ControlPlane || len(n.spec.JoinEndpoints) == 0 {
			controlPlanes = append(controlPlanes, fmt.Sprintf("--endpoint %s:%d", n.spec.IP, initPort))
		}
	}
	fmt.Fprintf(out, "Every node booted. The control planes wait to be recovered (docs/recovery.md):\n"+
		"  gatehouse recover --config %s --master-secret-file %s %s\n",
		filepath.Join(dir, clusterconfig.DefaultPath), filepath.Join(dir, clusterconfig.DefaultMasterSecretFile), strings.Join(controlPlanes, " "))
	return nil
}
