package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Down removes the local cluster recorded in dir: every node's processes
// (by mount namespace and cgroup), its network namespace and link, state
// disk loop device, cgroups and the mountpoints its agent created, then
// the load balancer, the registry, the bridge and the directory. It goes on past errors and reports them
// all; a missing cluster is not an error.
func Down(ctx context.Context, dir string, out io.Writer) error {
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
		n := rec.Nodes[i]
		fmt.Fprintf(out, "Removing node %s\n", n.Name)
		errs = append(errs, stopNode(ctx, rec.Network, n)...)
		if n.LoopDevice != "" {
			if err := run(ctx, "losetup", "--detach", n.LoopDevice); err != nil && !strings.Contains(err.Error(), "No such") {
				errs = append(errs, err)
			}
		}
		if n.HostVeth != "" {
			_ = run(ctx, "ip", "link", "del", n.HostVeth)
		}
		if n.NetNS != "" {
			if err := run(ctx, "ip", "netns", "del", n.NetNS); err != nil && !strings.Contains(err.Error(), "No such file") {
				errs = append(errs, err)
			}
		}
		// A host directory the node's agent created as a mountpoint stays
		// while another local cluster runs: removing it would take that
		// cluster's nodes' bind mounts on it with it (the kernel detaches
		// the mounts on a removed directory in every mount namespace).
		if data, err := os.ReadFile(filepath.Join(n.Dir, mountpointsFile)); err == nil {
			if others, err := otherNetworks(rec.Network); err != nil {
				errs = append(errs, err)
			} else if len(others) == 0 {
				for _, mp := range strings.Fields(string(data)) {
					_ = os.Remove(mp) //nolint:gosec // a mountpoint the agent recorded creating; removed only if still empty
				}
			}
		}
	}
	errs = append(errs, stopProcess(ctx, "haproxy", rec.LoadBalancerPID), stopProcess(ctx, "the registry", rec.RegistryPID))
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

// stopNode stops every process of node n on network nw, as a power cut would: its agent
// (which stops its TPM, containerd and kubelet), whatever is left in its
// mount namespace, and its pods' processes in its cgroups, whose tree it
// removes. Its network, disks and directories stay.
//
// The recorded mount namespace and agent PID are the node's only while its
// namespace lives: the kernel gives a freed namespace's number to the next
// new one, such as a node's of another local cluster, and a PID to the next
// process. So nothing is signalled there unless the namespace is still the
// node's (nodeMountNSPIDs).
func stopNode(ctx context.Context, nw Network, n NodeRecord) []error {
	var errs []error
	if n.AgentPID > 0 && (n.AgentMountNS == "" || slices.Contains(nodeMountNSPIDs(n), n.AgentPID)) {
		// Without a namespace the record was saved before the agent entered
		// its own, which it does at once (startAgent).
		_ = syscall.Kill(n.AgentPID, syscall.SIGTERM)
		waitGone(ctx, n.AgentPID, 15*time.Second)
	}
	killPIDs(nodeMountNSPIDs(n))
	if n.CgroupRoot != "" {
		if err := removeCgroup(ctx, n.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	if n.AgentMountNS != "" {
		if err := killMountNS(ctx, n, 15*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
		}
	}
	// Where device-mapper exists the node's state disk is mapped; with its
	// mount namespace gone, nothing holds the mapping: a power cut.
	if _, err := os.Stat("/dev/mapper/" + nw.stateMapperName(n.Name)); err == nil {
		mapping := "/dev/mapper/" + nw.stateMapperName(n.Name)
		err := poll(ctx, 200*time.Millisecond, 10*time.Second, "closing "+mapping, func() (bool, error) {
			return run(ctx, "cryptsetup", "close", nw.stateMapperName(n.Name)) == nil, nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
		}
	}
	return errs
}

// killMountNS kills every process in node n's mount namespace until none
// is left (or the namespace is no longer n's), or fails after timeout.
func killMountNS(ctx context.Context, n NodeRecord, timeout time.Duration) error {
	var pids []int
	err := poll(ctx, 100*time.Millisecond, timeout, "the processes of mount namespace "+n.AgentMountNS+" to exit", func() (bool, error) {
		if pids = nodeMountNSPIDs(n); len(pids) == 0 {
			return true, nil
		}
		killPIDs(pids)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("processes %v survive SIGKILL: %w", pids, err)
	}
	return nil
}

// waitGone waits for process pid to exit, and kills it after timeout.
func waitGone(ctx context.Context, pid int, timeout time.Duration) {
	err := poll(ctx, 100*time.Millisecond, timeout, fmt.Sprintf("process %d to exit", pid), func() (bool, error) {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH), nil
	})
	if err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// Status prints the local cluster's nodes, or that there is none.
func Status(ctx context.Context, dir string, out io.Writer) error {
	rec, err := ReadRecord(dir)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(out, "No local cluster in %s.\n", dir)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Local cluster in %s, created %s.\n", dir, rec.Created.Format(time.RFC3339))
	for _, n := range rec.Nodes {
		status, _ := os.ReadFile(filepath.Join(n.Dir, bootstrapStatusFile))
		bootstrap := strings.TrimSpace(string(status))
		// PID 0 would signal our own process group: a stopped node has none.
		alive := n.AgentPID > 0 && syscall.Kill(n.AgentPID, 0) == nil
		switch {
		case !alive:
			bootstrap = "off"
		case bootstrap == "":
			bootstrap = "running (joining, rejoining or waiting to be recovered)"
		}
		fmt.Fprintf(out, "  %-10s agent running: %-5t bootstrap: %s\n", n.Name, alive, bootstrap)
	}
	if rec.Kubeconfig == "" {
		return nil
	}
	svc, err := servicesFromKubeconfig(rec.Kubeconfig)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := svc.printNodes(ctx, out); err != nil {
		fmt.Fprintf(out, "The API server does not answer (%v). After `gatehouse mini start`, the control planes wait for `gatehouse recover` (docs/recovery.md).\n", err)
	}
	fmt.Fprintln(out)
	if rec.LoadBalancerPID > 0 {
		fmt.Fprintf(out, "API servers' load balancer: haproxy at %s, running: %t\n", rec.Network.loadBalancerEndpoint(), syscall.Kill(rec.LoadBalancerPID, 0) == nil)
	}
	members, err := EtcdMembers(ctx, dir)
	if err != nil {
		fmt.Fprintf(out, "etcd: %v\n", err)
		return nil
	}
	var list []string
	for _, m := range members {
		state := "healthy"
		switch {
		case !m.Healthy:
			state = "unhealthy"
		case m.IsLearner:
			state = "learner"
		}
		list = append(list, m.Name+" "+state)
	}
	fmt.Fprintf(out, "etcd: %d members (%s)\n", len(members), strings.Join(list, ", "))
	return nil
}
