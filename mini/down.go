package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
)

// Down removes the local cluster recorded in dir: every node, newest
// first, through the provider that made it (Provider.Delete: its
// processes, network, disks and what its machine left on the host), then
// the load balancer, the registry, the mirror, the bridge and the directory. It goes
// on past errors and reports them all; a missing cluster is not an error.
func Down(ctx context.Context, dir string, out io.Writer) error {
	return down(ctx, dir, out, providerFor)
}

// down is Down with the providers providerFor returns.
func down(ctx context.Context, dir string, out io.Writer, providerFor providerLookup) error {
	rec, err := ReadRecord(dir)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(out, "No local cluster in %s.\n", dir)
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for i := len(rec.Nodes) - 1; i >= 0; i-- {
		n := &rec.Nodes[i]
		fmt.Fprintf(out, "Removing node %s\n", n.Name)
		p, err := providerFor(rec, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := p.Delete(ctx, n); err != nil {
			errs = append(errs, fmt.Errorf("removing node %s: %w", n.Name, err))
		}
	}
	errs = append(errs, stopProcess(ctx, "haproxy", rec.LoadBalancerPID), stopProcess(ctx, "the registry", rec.RegistryPID),
		stopProcess(ctx, "the mirror", rec.MirrorPID))
	if rec.Bridge != "" {
		if err := run(ctx, "ip", "link", "del", rec.Bridge); err != nil && !strings.Contains(err.Error(), "Cannot find") {
			errs = append(errs, err)
		}
	}
	if errors.Join(errs...) == nil {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
		fmt.Fprintf(out, "Removed the local cluster in %s.\n", dir)
	}
	return errors.Join(errs...)
}

// otherNetworks lists the networks other than own where a local cluster
// runs (its bridge exists).
func otherNetworks(own Network) ([]Network, error) {
	running, err := runningNetworks()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(running, func(n Network) bool { return n == own }), nil
}
