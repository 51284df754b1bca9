package mini

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// netnsProvider makes a node's machine of namespaces on the host: a
// network namespace with a veth pair on the cluster bridge, a private
// mount namespace, a cgroup root, and a loop device over a 64 MiB file as
// its state disk. Its "power" is the node agent (`gatehouse mini
// node-agent`), which runs the node's swtpm, containerd, kubelet and
// bootstrapper; a reset kills every process of the node and starts the
// agent again, whose TPM starts from zero PCRs. The kernel is the host's:
// nothing boots.
type netnsProvider struct {
	// gatehouse is the binary the node agent runs.
	gatehouse string
	// network is the cluster's network (the node's device-mapper name).
	network Network
}

// cloudMetadataIP is the address of every cloud's instance metadata
// service (docs/cloud.md).
const cloudMetadataIP = "169.254.169.254"

// Name is ProviderNetNS.
func (*netnsProvider) Name() string { return ProviderNetNS }

// StartsBeforeJoinData is true: the agent boots at once and waits for
// node.json to name the join endpoints.
func (*netnsProvider) StartsBeforeJoinData() bool { return true }

// Create makes the node's network namespace with its veth pair and
// address on the bridge, its state disk (a loop device over
// state-disk.img in s.Dir, which it sets as s.StateDisk) and its cgroup
// root, recording each in nr as it is made.
func (*netnsProvider) Create(ctx context.Context, s *NodeSpec, nr *NodeRecord) error {
	if err := os.MkdirAll(s.logDir(), 0o750); err != nil {
		return err
	}
	if err := run(ctx, "ip", "netns", "add", s.NetNS); err != nil {
		return err
	}
	nr.NetNS = s.NetNS
	veth := s.Network.hostVeth(s.Name)
	if err := run(ctx, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", s.NetNS); err != nil {
		return err
	}
	nr.HostVeth = veth
	for _, args := range [][]string{
		{"link", "set", veth, "master", s.Network.Bridge()},
		{"link", "set", veth, "up"},
		{"-n", s.NetNS, "addr", "add", s.IP + "/24", "dev", "eth0"},
		{"-n", s.NetNS, "link", "set", "eth0", "up"},
		{"-n", s.NetNS, "link", "set", "lo", "up"},
		// No route out (docs/install-airgapped.md): the node reaches the
		// cluster bridge (the other nodes, the load balancer, the host's
		// registry and mirror), the pod ranges (routePods) and the
		// Service range, which kube-proxy's rules turn into those before
		// anything leaves; everything else is unreachable at once.
		{"-n", s.NetNS, "route", "add", serviceCIDR, "via", s.Gateway},
		{"-n", s.NetNS, "route", "add", "unreachable", "default"},
	} {
		if err := run(ctx, "ip", args...); err != nil {
			return err
		}
	}
	if s.CloudMetadata != "" {
		// Where every cloud's instance metadata service answers.
		if err := run(ctx, "ip", "-n", s.NetNS, "addr", "add", cloudMetadataIP+"/32", "dev", "lo"); err != nil {
			return err
		}
	}
	img := filepath.Join(s.Dir, "state-disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return err
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", img).Output()
	if err != nil {
		return fmt.Errorf("attaching the state disk: %w", err)
	}
	s.StateDisk = strings.TrimSpace(string(out))
	nr.LoopDevice = s.StateDisk
	if err := createCgroup(s.CgroupRoot); err != nil {
		return err
	}
	nr.CgroupRoot = s.CgroupRoot
	return nil
}

// Start starts the node agent in the node's namespaces: on its first boot
// its containerd starts from the cluster's seed where there is one. The
// previous boot's outcome (bootstrap.status, which the agent writes also
// when it is stopped) is removed first: it is not this boot's.
func (p *netnsProvider) Start(ctx context.Context, s *NodeSpec, nr *NodeRecord) error {
	if err := createCgroup(s.CgroupRoot); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.Dir, bootstrapStatusFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	seedContainerd(s)
	return p.startAgent(ctx, s, nr)
}

// Stop stops every process of the node (stopNode) and forgets the agent.
func (p *netnsProvider) Stop(ctx context.Context, nr *NodeRecord) error {
	errs := stopNode(ctx, p.network, *nr)
	nr.AgentPID, nr.AgentMountNS = 0, ""
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stopping %s: %w", nr.Name, err)
	}
	return nil
}

// Reset stops every process of the node and starts its agent again.
func (p *netnsProvider) Reset(ctx context.Context, s *NodeSpec, nr *NodeRecord) error {
	if err := p.Stop(ctx, nr); err != nil {
		return err
	}
	return p.Start(ctx, s, nr)
}

// Delete stops the node and removes its loop device, veth pair and
// network namespace, and the host directories its agent created as
// mountpoints (only while no other local cluster runs: removing one would
// take that cluster's nodes' bind mounts on it with it, as the kernel
// detaches the mounts on a removed directory in every mount namespace).
func (p *netnsProvider) Delete(ctx context.Context, nr *NodeRecord) error {
	errs := stopNode(ctx, p.network, *nr)
	if nr.LoopDevice != "" {
		if err := run(ctx, "losetup", "--detach", nr.LoopDevice); err != nil && !strings.Contains(err.Error(), "No such") {
			errs = append(errs, err)
		}
	}
	if nr.HostVeth != "" {
		_ = run(ctx, "ip", "link", "del", nr.HostVeth)
	}
	if nr.NetNS != "" {
		if err := run(ctx, "ip", "netns", "del", nr.NetNS); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(nr.Dir, mountpointsFile)); err == nil {
		if others, err := otherNetworks(p.network); err != nil {
			errs = append(errs, err)
		} else if len(others) == 0 {
			for _, mp := range strings.Fields(string(data)) {
				_ = os.Remove(mp) //nolint:gosec // a mountpoint the agent recorded creating; removed only if still empty
			}
		}
	}
	return errors.Join(errs...)
}

// Exec runs argv in the node's network and mount namespaces (nsenter),
// as the node's own processes see the host.
func (*netnsProvider) Exec(ctx context.Context, nr *NodeRecord, argv ...string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command to run")
	}
	pids := nodeMountNSPIDs(*nr)
	if len(pids) == 0 || nr.NetNS == "" {
		return nil, fmt.Errorf("node %s runs no process to enter (is it off?)", nr.Name)
	}
	args := append([]string{"--net=/run/netns/" + nr.NetNS, "--mount=/proc/" + strconv.Itoa(pids[0]) + "/ns/mnt", "--"}, argv...)
	out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("running %s on %s: %w", argv[0], nr.Name, err)
	}
	return out, nil
}

// Logs are the logs of the node's processes, the agent's first.
func (*netnsProvider) Logs(nr *NodeRecord) []string {
	logs := []string{filepath.Join(nr.Dir, "logs", "agent.log")}
	others, _ := filepath.Glob(filepath.Join(nr.Dir, "logs", "*.log"))
	for _, l := range others {
		if !slices.Contains(logs, l) {
			logs = append(logs, l)
		}
	}
	return logs
}

// Running reports whether the node's agent runs.
func (*netnsProvider) Running(nr *NodeRecord) bool {
	// PID 0 would signal our own process group: a stopped node has none.
	return nr.AgentPID > 0 && syscall.Kill(nr.AgentPID, 0) == nil
}

// seedContainerd gives a node's containerd, on its first boot, a copy of
// the cluster's containerd seed and records that its images are there;
// without a seed, or when it cannot be linked, the node imports them.
func seedContainerd(s *NodeSpec) {
	root := filepath.Join(s.rootDir(), "var/lib/containerd")
	if s.ImagesSeed == "" || s.ImagesDigest == "" {
		return
	}
	if _, err := os.Stat(root); err == nil {
		return // not a first boot
	}
	if err := linkSeed(s.ImagesSeed, root); err != nil {
		return
	}
	_ = os.WriteFile(filepath.Join(s.Dir, imagesImportedFile), []byte(s.ImagesDigest+"\n"), 0o644) //nolint:gosec // a digest
}

// startAgent starts the node agent of s in its network namespace and a new
// private mount namespace, and records it in nr.
func (p *netnsProvider) startAgent(ctx context.Context, s *NodeSpec, nr *NodeRecord) error {
	logFile, err := os.OpenFile(filepath.Join(s.logDir(), "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // no secrets
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command("nsenter", "--net=/run/netns/"+s.NetNS, "--",
		"unshare", "--mount", "--propagation", "private", "--",
		p.gatehouse, "mini", "node-agent", "--spec", filepath.Join(s.Dir, "node.json"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), nodeGOGC)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the agent of %s: %w", s.Name, err)
	}
	nr.AgentPID = cmd.Process.Pid
	go func() { _ = cmd.Wait() }()
	// The agent's mount namespace is unshare's once it has exec'd the agent.
	host, _ := mountNS(os.Getpid())
	return poll(ctx, 50*time.Millisecond, 10*time.Second, "the agent of "+s.Name+" to enter its mount namespace", func() (bool, error) {
		ns, err := mountNS(cmd.Process.Pid)
		if err != nil || ns == host {
			return false, nil
		}
		nr.AgentMountNS = ns
		return true, nil
	})
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
