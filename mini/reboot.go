package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
)

// RebootNode power-cycles node name of the local cluster in dir: every
// process of the node stops (its pods too), its disks and directories
// stay, and its agent starts again, as after a reboot. The TPM restarts
// from zero PCRs and the boot is measured again, so the node lock is free;
// the node's bootstrapper finds its state disk initialised and rejoins
// through the join service (attested), and its kubelet starts only once
// that succeeded. With tamper, the node measures a changed boot manifest
// from this boot on (recorded in its node.json; to see a rebooted node
// refused). It returns once the agent
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
	if errs := stopNode(ctx, rec.Network, nr); len(errs) > 0 {
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

// Stop powers off every node of the local cluster in dir, as a power cut
// would: every process stops, disks and directories stay (Start boots
// them again).
func Stop(ctx context.Context, dir string, out io.Writer) error {
	rec, err := ReadRecord(dir)
	if err != nil {
		return fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	var errs []error
	for i := len(rec.Nodes) - 1; i >= 0; i-- {
		fmt.Fprintf(out, "Stopping %s\n", rec.Nodes[i].Name)
		errs = append(errs, stopNode(ctx, rec.Network, rec.Nodes[i])...)
		rec.Nodes[i].AgentPID, rec.Nodes[i].AgentMountNS = 0, ""
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
	rec, err := ReadRecord(dir)
	if err != nil {
		return fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var controlPlanes []string
	for _, n := range slices.Clone(rec.Nodes) {
		if n.AgentPID > 0 {
			return fmt.Errorf("node %s runs (agent %d): stop the cluster first (gatehouse mini stop)", n.Name, n.AgentPID)
		}
		spec, err := ReadNodeSpec(filepath.Join(n.Dir, "node.json"))
		if err != nil {
			return err
		}
		if err := createCgroup(spec.CgroupRoot); err != nil {
			return err
		}
		if err := os.Remove(filepath.Join(spec.Dir, bootstrapStatusFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		fmt.Fprintf(out, "Booting %s\n", n.Name)
		if err := startAgent(ctx, self, rec, spec); err != nil {
			return err
		}
		if spec.ControlPlane || len(spec.JoinEndpoints) == 0 {
			controlPlanes = append(controlPlanes, fmt.Sprintf("--endpoint %s:%d", spec.IP, initPort))
		}
	}
	fmt.Fprintf(out, "Every node booted. The control planes wait to be recovered (docs/recovery.md):\n"+
		"  gatehouse recover --config %s --master-secret-file %s %s\n",
		filepath.Join(dir, clusterconfig.DefaultPath), filepath.Join(dir, clusterconfig.DefaultMasterSecretFile), strings.Join(controlPlanes, " "))
	return nil
}

// AddWorker starts another worker in the local cluster in dir, which joins
// through the join services as the workers of `mini up` do, and returns
// its name. It returns once the node's agent runs; the join goes on in
// the node (watch it with Status).
func AddWorker(ctx context.Context, dir string, out io.Writer) (string, error) {
	rec, err := ReadRecord(dir)
	if err != nil {
		return "", fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	if len(rec.JoinEndpoints) == 0 || rec.CACertHash == "" {
		return "", errors.New("the cluster's record names no join service: it was not made by this version's mini up, or mini up had not finished")
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
	// The first control plane's spec is the cluster's: binaries, images,
	// the reference boot manifest and the TPM manufacturer.
	w := *first
	w.place(dir, i, name)
	w.ControlPlane, w.Init = false, false
	w.JoinEndpoints, w.CACertHash = rec.JoinEndpoints, rec.CACertHash
	fmt.Fprintf(out, "Starting node %s (%s; worker): it joins through the join service\n", name, w.IP)
	return name, startNode(ctx, w.BinDir, rec, &w)
}
