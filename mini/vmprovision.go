package mini

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
)

// RestartVMNode powers VM node name of the local cluster in dir off and
// boots it again from the node image in nodeImage, which may be another
// than it ran (a changed image, to see the node refused); the cluster's
// record keeps the image its other VM nodes boot.
func RestartVMNode(ctx context.Context, dir, name, nodeImage string) error {
	rec, err := readCluster(dir)
	if err != nil {
		return err
	}
	n, err := readNode(rec, name, providerFor)
	if err != nil {
		return err
	}
	if n.rec.Provider != ProviderQEMU {
		return fmt.Errorf("node %s is no VM (provider %q)", name, n.rec.Provider)
	}
	p, err := newQEMUProvider(nodeImage, "", nil)
	if err != nil {
		return err
	}
	if err := p.Stop(ctx, n.rec); err != nil {
		return errors.Join(err, rec.save())
	}
	err = p.Start(ctx, n.spec, n.rec)
	return errors.Join(err, rec.save())
}

// VMConsoleLog is the serial console log of VM node name in the cluster
// directory dir: firmware, kernel, systemd and the bootstrapper's log.
func VMConsoleLog(dir, name string) string {
	return filepath.Join(vmDir(filepath.Join(dir, "nodes", name)), "console.log")
}

// VMPIDs returns the QEMU and swtpm processes of VM node name in the
// cluster directory dir (0 when it does not run).
func VMPIDs(dir, name string) (qemuPID, tpmPID int, err error) {
	rec, err := readVMRecord(filepath.Join(dir, "nodes", name))
	return rec.QEMUPID, rec.TPMPID, err
}
