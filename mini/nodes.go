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

// providerFor returns the provider that made node nr of the cluster rec
// records, as its record names it.
func providerFor(rec *Record, nr *NodeRecord) (Provider, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p, err := newProvider(nr.Provider, providerConfig{Network: rec.Network, Gatehouse: self, NodeImage: rec.NodeImage})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", nr.Name, err)
	}
	return p, nil
}

// createNode makes node s's machine with p, powered off, and writes its
// node.json. The record is saved after the provider's call, also when it
// failed: Down finds what was made.
func createNode(ctx context.Context, rec *Record, p Provider, s *NodeSpec) error {
	nr := rec.node(s.Name)
	nr.Dir, nr.Provider = s.Dir, p.Name()
	if err := os.MkdirAll(s.logDir(), 0o750); err != nil {
		return err
	}
	err := p.Create(ctx, s, nr)
	if err := errors.Join(err, rec.save()); err != nil {
		return fmt.Errorf("creating node %s (%s): %w", s.Name, p.Name(), err)
	}
	return s.write()
}

// bootNode powers node s's machine on with p and saves the record, also
// when that failed.
func bootNode(ctx context.Context, rec *Record, p Provider, s *NodeSpec) error {
	err := p.Start(ctx, s, rec.node(s.Name))
	if err := errors.Join(err, rec.save()); err != nil {
		return fmt.Errorf("starting node %s (%s): %w", s.Name, p.Name(), err)
	}
	return nil
}

// clusterNode is one node of a running cluster: its record, its spec
// (node.json) and its provider.
type clusterNode struct {
	rec      *NodeRecord
	spec     *NodeSpec
	provider Provider
}

// readNode returns node name of the cluster rec records.
func readNode(rec *Record, name string) (*clusterNode, error) {
	i := slices.IndexFunc(rec.Nodes, func(n NodeRecord) bool { return n.Name == name })
	if i < 0 {
		var names []string
		for _, n := range rec.Nodes {
			names = append(names, n.Name)
		}
		return nil, fmt.Errorf("no node %q in the local cluster; its nodes are %v", name, names)
	}
	nr := &rec.Nodes[i]
	spec, err := ReadNodeSpec(filepath.Join(nr.Dir, "node.json"))
	if err != nil {
		return nil, err
	}
	p, err := providerFor(rec, nr)
	if err != nil {
		return nil, err
	}
	return &clusterNode{rec: nr, spec: spec, provider: p}, nil
}

// readCluster reads the record of the local cluster in dir.
func readCluster(dir string) (*Record, error) {
	rec, err := ReadRecord(dir)
	if err != nil {
		return nil, fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	return rec, nil
}

// WorkerOptions say how AddWorker makes the worker's machine.
type WorkerOptions struct {
	// Provider names the node provider (ProviderNetNS when empty).
	Provider string
	// NodeImage is the node image's directory a qemu worker boots; empty:
	// the one the cluster's record names.
	NodeImage string
}

// AddWorker starts another worker in the local cluster in dir, which joins
// through the join services as the workers of `mini up` do, and returns
// its name. It returns once the node's machine runs; the join goes on in
// the node (watch it with Status).
func AddWorker(ctx context.Context, dir string, opts WorkerOptions, out io.Writer) (string, error) {
	rec, err := readCluster(dir)
	if err != nil {
		return "", err
	}
	if len(rec.JoinEndpoints) == 0 || rec.CACertHash == "" {
		return "", errors.New("the cluster's record names no join service: it was not made by this version's mini up, or mini up had not finished")
	}
	if opts.NodeImage != "" {
		rec.NodeImage = opts.NodeImage
	}
	if err := checkProvider(opts.Provider, rec.NodeImage); err != nil {
		return "", err
	}
	p, err := providerFor(rec, &NodeRecord{Name: "the new worker", Provider: opts.Provider})
	if err != nil {
		return "", err
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
	fmt.Fprintf(out, "Starting node %s (%s; worker, %s): it joins through the join service\n", name, w.IP, p.Name())
	if err := createNode(ctx, rec, p, &w); err != nil {
		return name, err
	}
	return name, bootNode(ctx, rec, p, &w)
}

// Exec runs argv on node name of the local cluster in dir through its
// provider (Provider.Exec) and returns the command's combined output;
// ErrNoExec for a machine that offers no way in (a VM of the node image).
func Exec(ctx context.Context, dir, name string, argv ...string) ([]byte, error) {
	rec, err := readCluster(dir)
	if err != nil {
		return nil, err
	}
	n, err := readNode(rec, name)
	if err != nil {
		return nil, err
	}
	return n.provider.Exec(ctx, n.rec, argv...)
}
