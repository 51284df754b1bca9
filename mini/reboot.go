package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// RebootNode power-cycles node name of the local cluster in dir: every
// process of the node stops (its pods too), its disks and directories
// stay, and its agent starts again, as after a reboot. The TPM restarts
// from zero PCRs and the boot is measured again, so the node lock is free;
// the node's bootstrapper finds its state disk initialised and rejoins
// through the join service (attested), and its kubelet starts only once
// that succeeded. With tamper, the node measures a changed boot manifest
// this time (to see a rebooted node refused). It returns once the agent
// runs; the rejoin goes on in the node.
func RebootNode(ctx context.Context, dir, name string, tamper bool, out io.Writer) error {
	rec, err := ReadRecord(dir)
	if err != nil {
		return fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	i := slices.IndexFunc(rec.Nodes, func(n NodeRecord) bool { return n.Name == name })
	if i < 0 {
		var names []string
		for _, n := range rec.Nodes {
			names = append(names, n.Name)
		}
		return fmt.Errorf("no node %q in the local cluster; its nodes are %v", name, names)
	}
	nr := rec.Nodes[i]
	spec, err := ReadNodeSpec(filepath.Join(nr.Dir, "node.json"))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Stopping every process of %s\n", name)
	if errs := stopNode(ctx, nr); len(errs) > 0 {
		return fmt.Errorf("stopping %s: %w", name, errors.Join(errs...))
	}
	if err := createCgroup(spec.CgroupRoot); err != nil {
		return err
	}
	if tamper && len(spec.BootManifest) > 0 {
		spec.BootManifest[len(spec.BootManifest)-1] ^= 1
		if err := spec.write(); err != nil {
			return err
		}
	}
	// The previous boot's outcome is not this boot's.
	if err := os.Remove(filepath.Join(spec.Dir, bootstrapStatusFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Starting %s: its TPM starts from zero PCRs and its boot is measured again; it rejoins through the join service\n", name)
	return startAgent(ctx, self, rec, spec)
}
