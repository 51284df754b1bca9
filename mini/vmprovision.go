package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/gatehouse-dev/gatehouse/image/qemu"
)

// VMOptions say how VM nodes boot: the node image and QEMU's accelerator.
type VMOptions struct {
	// NodeImage is the node image's directory (hack/node-image.sh). The
	// cluster's policy must accept its values: mini up with
	// Options.NodeImage naming an image of the same build.
	NodeImage string
	// Accel is QEMU's accelerator (qemu.AccelAuto: KVM where usable).
	Accel qemu.Accel
	// Log, when set, receives each VM's boot progress.
	Log *slog.Logger
}

func (o VMOptions) provider() (*qemuProvider, error) {
	return newQEMUProvider(o.NodeImage, o.Accel, o.Log)
}

// AddVMWorker starts another worker of the local cluster in dir as a VM of
// the node image (the qemu provider), which joins through the join
// services as the workers of `mini up` do, and returns its name. It
// returns once QEMU runs; the VM boots, attests and joins on its own (its
// serial console: VMConsoleLog).
func AddVMWorker(ctx context.Context, dir string, opts VMOptions, out io.Writer) (string, error) {
	p, err := opts.provider()
	if err != nil {
		return "", err
	}
	rec, err := ReadRecord(dir)
	if err != nil {
		return "", fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	if len(rec.JoinEndpoints) == 0 || rec.CACertHash == "" {
		return "", errors.New("the cluster's record names no join service: mini up had not finished")
	}
	i, workers := len(rec.Nodes), 0
	var first *NodeSpec
	for _, n := range rec.Nodes {
		spec, err := ReadNodeSpec(filepath.Join(n.Dir, "node.json"))
		if err != nil {
			return "", err
		}
		if spec.Init {
			first = spec
		}
		if !spec.ControlPlane {
			workers++
		}
	}
	if first == nil {
		return "", errors.New("the cluster's record has no first control plane")
	}
	if workers >= MaxWorkers || i >= MaxControlPlanes+MaxWorkers {
		return "", fmt.Errorf("the local cluster has %d workers, the most it can have", workers)
	}
	name := fmt.Sprintf("worker-%d", workers+1)
	w := *first
	w.place(dir, i, name)
	w.ControlPlane, w.Init = false, false
	w.JoinEndpoints, w.CACertHash = rec.JoinEndpoints, rec.CACertHash
	w.StateDisk, w.ImagesSeed, w.BootManifest = "", "", nil
	fmt.Fprintf(out, "Creating VM node %s (%s; worker): tap on %s, its own TPM and state disk\n", name, w.IP, rec.Network.Bridge())
	nr := rec.node(name)
	err = p.Create(ctx, &w, nr)
	if serr := rec.save(); err == nil {
		err = serr
	}
	if err != nil {
		return name, err
	}
	if err := w.write(); err != nil {
		return name, err
	}
	fmt.Fprintf(out, "Booting %s from %s: it joins through the join service\n", name, qemuImageDisk(opts.NodeImage, false))
	return name, p.Start(ctx, &w, nr)
}

// vmNode returns the spec and record of VM node name of the cluster in
// dir.
func vmNode(dir, name string) (*Record, *NodeSpec, *NodeRecord, error) {
	rec, err := ReadRecord(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	i := slices.IndexFunc(rec.Nodes, func(n NodeRecord) bool { return n.Name == name })
	if i < 0 || rec.Nodes[i].Provider != ProviderQEMU {
		return nil, nil, nil, fmt.Errorf("no VM node %q in the local cluster in %s", name, dir)
	}
	spec, err := ReadNodeSpec(filepath.Join(rec.Nodes[i].Dir, "node.json"))
	if err != nil {
		return nil, nil, nil, err
	}
	return rec, spec, &rec.Nodes[i], nil
}

// ResetVMNode reboots VM node name the hard way (its reset line): the
// firmware measures the new boot into the TPM, whose PCRs start from zero;
// the node rejoins and opens its state disk.
func ResetVMNode(ctx context.Context, dir, name string, opts VMOptions) error {
	p, err := opts.provider()
	if err != nil {
		return err
	}
	rec, spec, nr, err := vmNode(dir, name)
	if err != nil {
		return err
	}
	err = p.Reset(ctx, spec, nr)
	return errors.Join(err, rec.save())
}

// RestartVMNode powers VM node name off and boots it again from the node
// image of opts, which may be another than it ran (a changed image, to see
// it refused).
func RestartVMNode(ctx context.Context, dir, name string, opts VMOptions) error {
	p, err := opts.provider()
	if err != nil {
		return err
	}
	rec, spec, nr, err := vmNode(dir, name)
	if err != nil {
		return err
	}
	if err := p.Stop(ctx, nr); err != nil {
		return errors.Join(err, rec.save())
	}
	err = p.Start(ctx, spec, nr)
	return errors.Join(err, rec.save())
}

// DeleteVMNodes deletes every VM node of the local cluster in dir (their
// processes, tap devices and directories) and drops them from its record;
// `mini down` removes the rest.
func DeleteVMNodes(ctx context.Context, dir string) error {
	rec, err := ReadRecord(dir)
	if err != nil {
		return fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	p := &qemuProvider{log: slog.New(slog.DiscardHandler)}
	var errs []error
	kept := rec.Nodes[:0]
	for _, n := range rec.Nodes {
		if n.Provider != ProviderQEMU {
			kept = append(kept, n)
			continue
		}
		if err := p.Delete(ctx, &n); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", n.Name, err))
			kept = append(kept, n)
		}
	}
	rec.Nodes = kept
	return errors.Join(append(errs, rec.save())...)
}

// VMConsoleLog is the serial console log of VM node name in the cluster
// directory dir: firmware, kernel, systemd and the bootstrapper's log.
func VMConsoleLog(dir, name string) string {
	return filepath.Join(dir, "nodes", name, "vm", "console.log")
}

// VMPIDs returns the QEMU and swtpm processes of VM node name in the
// cluster directory dir (0 when it does not run).
func VMPIDs(dir, name string) (qemuPID, tpmPID int, err error) {
	rec, err := readVMRecord(filepath.Join(dir, "nodes", name))
	return rec.QEMUPID, rec.TPMPID, err
}
