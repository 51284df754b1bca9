package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// providerLookup returns the provider that made node nr of the cluster
// rec records: providerFor, or a test's.
type providerLookup func(rec *Record, nr *NodeRecord) (Provider, error)

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
func readNode(rec *Record, name string, providerFor providerLookup) (*clusterNode, error) {
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
	// NodeImage is the node image's directory a qemu worker boots when
	// the cluster's record names none.
	NodeImage string
	// UserData, when not empty, is cloud-config user data (a Cluster API
	// bootstrap data Secret's value, docs/capi.md) the worker gets as an
	// infrastructure provider hands it over: on a NoCloud seed disk, read
	// by cloud-init in the node image. The worker then joins where and as
	// the data says; mini provisions only what the platform gives a
	// machine (its address, routes, registry mirror, CNI network). Only
	// qemu workers boot user data.
	UserData []byte
	// CloudMetadata, when set (gce, aws or azure), makes the worker take
	// its name, address and join endpoints from that cloud's instance
	// metadata service at 169.254.169.254 in its network namespace
	// (gatehouse-bootstrapper --cloud, docs/cloud.md), which the caller
	// serves there (test/e2e does); only namespace workers.
	CloudMetadata string
}

// AddWorker starts another worker in the local cluster in dir, which joins
// through the join services as the workers of `mini up` do, and returns
// its name. It returns once the node's machine runs; the join goes on in
// the node (watch it with Status).
func AddWorker(ctx context.Context, dir string, opts WorkerOptions, out io.Writer) (string, error) {
	return addWorker(ctx, dir, opts, out, providerFor)
}

// addWorker is AddWorker with the providers providerFor returns.
func addWorker(ctx context.Context, dir string, opts WorkerOptions, out io.Writer, providerFor providerLookup) (string, error) {
	rec, err := readCluster(dir)
	if err != nil {
		return "", err
	}
	if len(rec.JoinEndpoints) == 0 || rec.CACertHash == "" {
		return "", errors.New("the cluster's record names no join service: it was not made by this version's mini up, or mini up had not finished")
	}
	if rec.NodeImage == "" {
		rec.NodeImage = opts.NodeImage
	}
	if err := checkProvider(opts.Provider, rec.NodeImage); err != nil {
		return "", err
	}
	if len(opts.UserData) > 0 && opts.Provider != ProviderQEMU {
		return "", fmt.Errorf("user data boots in a VM of the node image: add the worker with provider %s", ProviderQEMU)
	}
	switch {
	case opts.CloudMetadata != "" && opts.Provider != "" && opts.Provider != ProviderNetNS:
		return "", fmt.Errorf("cloud metadata is served in a namespace worker's network namespace: add the worker with provider %s", ProviderNetNS)
	case opts.CloudMetadata != "" && opts.CloudMetadata != "gce" && opts.CloudMetadata != "aws" && opts.CloudMetadata != "azure":
		return "", fmt.Errorf("cloud metadata %q: use gce, aws or azure", opts.CloudMetadata)
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
	w.CloudMetadata = opts.CloudMetadata
	how := "it joins through the join service"
	if w.CloudMetadata != "" {
		how = "it takes its name, address and join endpoints from " + w.CloudMetadata + " instance metadata at " + cloudMetadataIP + " in its network namespace"
	}
	if len(opts.UserData) > 0 {
		// Where to join and whom to trust come from the user data only.
		w.JoinEndpoints, w.CACertHash = nil, ""
		w.SeedDisk = filepath.Join(vmDir(w.Dir), "seed.img")
		how = "it joins as its user data says"
	}
	fmt.Fprintf(out, "Starting node %s (%s; worker, %s): %s\n", name, w.IP, p.Name(), how)
	if err := createNode(ctx, rec, p, &w); err != nil {
		return name, err
	}
	if w.SeedDisk != "" {
		// The instance ID stays the node's through reboots: cloud-init
		// runs its per-instance modules once.
		if err := writeNoCloudSeed(ctx, w.SeedDisk, opts.UserData, "mini-"+name, name); err != nil {
			return name, err
		}
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
	n, err := readNode(rec, name, providerFor)
	if err != nil {
		return nil, err
	}
	return n.provider.Exec(ctx, n.rec, argv...)
}

// waitListening waits until the bootstrapper of s listens for init (its
// init port accepts a connection), or fails when the node's machine or
// its bootstrapper ends first. nr is the node's record, p its provider.
func waitListening(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), p Provider, nr *NodeRecord, s *NodeSpec) error {
	addr := net.JoinHostPort(s.IP, strconv.Itoa(initPort))
	return poll(ctx, 100*time.Millisecond, 3*time.Minute, s.Name+"'s bootstrapper to listen for init", func() (bool, error) {
		if c, err := dial(ctx, "tcp", addr); err == nil {
			_ = c.Close()
			return true, nil
		}
		if status, err := os.ReadFile(filepath.Join(s.Dir, bootstrapStatusFile)); err == nil {
			return false, fmt.Errorf("its bootstrapper ended: %s (logs in %s)", strings.TrimSpace(string(status)), s.logDir())
		}
		if !p.Running(nr) {
			return false, fmt.Errorf("its machine stopped; see %s", strings.Join(p.Logs(nr), ", "))
		}
		return false, nil
	})
}

// kubeconfigCA returns the cluster CA certificate (PEM) the kubeconfig
// at path trusts.
func kubeconfigCA(path string) ([]byte, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, err
	}
	for _, c := range cfg.Clusters {
		if len(c.CertificateAuthorityData) > 0 {
			return c.CertificateAuthorityData, nil
		}
	}
	return nil, fmt.Errorf("%s names no cluster CA", path)
}
