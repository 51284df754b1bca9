package mini

import (
	"bufio"
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

// run runs a host command; errors carry its output.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// prerequisite is a program or file the local cluster needs.
type prerequisite struct {
	What, Path, HowToGet string
}

// prerequisites of a node; the Kubernetes and gatehouse binaries are
// checked separately.
var prerequisites = []prerequisite{
	{"containerd", "containerd", "apt-get install containerd (make setup does)"},
	{"runc", "runc", "apt-get install runc"},
	{"ctr", "ctr", "apt-get install containerd"},
	{"CNI plugins", "/usr/lib/cni/bridge", "apt-get install containernetworking-plugins"},
	{"iproute2", "ip", "apt-get install iproute2"},
	{"iptables", "iptables", "apt-get install iptables"},
	{"iptables (nf_tables) for the kube-proxy image", xtablesMulti, "apt-get install iptables"},
	{"nsenter and unshare", "nsenter", "apt-get install util-linux"},
	{"losetup", "losetup", "apt-get install mount"},
	{"swtpm", "swtpm", "apt-get install swtpm swtpm-tools"},
	{"cryptsetup", "cryptsetup", "apt-get install cryptsetup-bin"},
	{"haproxy (the API servers' load balancer of more than one control plane)", "haproxy", "apt-get install haproxy"},
}

// CheckPrerequisites returns an error naming every missing prerequisite
// and how to get it.
func CheckPrerequisites() error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("mini up needs root: it creates network namespaces, mounts, cgroups and loop devices (run it with sudo)"))
	}
	for _, p := range prerequisites {
		if strings.HasPrefix(p.Path, "/") {
			if _, err := os.Stat(p.Path); err != nil {
				errs = append(errs, fmt.Errorf("%s missing (%s): %s", p.What, p.Path, p.HowToGet))
			}
		} else if _, err := exec.LookPath(p.Path); err != nil {
			errs = append(errs, fmt.Errorf("%s missing: %s", p.What, p.HowToGet))
		}
	}
	return errors.Join(errs...)
}

// cgroupMounts returns the mountpoints of every cgroup hierarchy (v1
// controllers and the unified v2 one).
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		i := slices.Index(fields, "-")
		if i < 0 || i+1 >= len(fields) {
			continue
		}
		if fs := fields[i+1]; fs == "cgroup" || fs == "cgroup2" {
			out = append(out, fields[4])
		}
	}
	return out, lines.Err()
}

// createCgroup creates root in every hierarchy; a cpuset copies its
// parent's CPUs and memory nodes, without which nothing can join it.
func createCgroup(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		dir := filepath.Join(m, root)
		if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // a cgroup directory, as the kernel makes them
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			parent, err := os.ReadFile(filepath.Join(m, f))
			if err != nil {
				continue
			}
			if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil { //nolint:gosec // cgroup files
				return fmt.Errorf("setting %s of %s: %w", f, dir, err)
			}
		}
	}
	return nil
}

// removeCgroup kills every process in root's subtree in every hierarchy
// and removes the subtree, deepest first.
func removeCgroup(ctx context.Context, root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		dir := filepath.Join(m, root)
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, d := range dirs {
			killPIDs(readPIDs(filepath.Join(d, "cgroup.procs")))
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirRetry(ctx, dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func rmdirRetry(ctx context.Context, dir string) error {
	// The kernel frees a cgroup after its last process is reaped.
	return poll(ctx, 100*time.Millisecond, 5*time.Second, "cgroup "+dir+" to be removable", func() (bool, error) {
		err := syscall.Rmdir(dir)
		return err == nil || errors.Is(err, syscall.ENOENT), nil
	})
}

func readPIDs(file string) []int {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killPIDs(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// mountNS returns the mount namespace of pid ("mnt:[inode]").
func mountNS(pid int) (string, error) {
	return os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
}

// nodeMountNSPIDs returns the processes in node n's recorded mount
// namespace, or none when that namespace is no longer n's: a namespace's
// number is given to the next new one once it is freed, such as to a node's
// of another local cluster. The namespace is n's while a process in it is in
// n's network namespace (which /run/netns/<n.NetNS> keeps, so its number is
// not reused while that exists) or has n's root directory mounted.
func nodeMountNSPIDs(n NodeRecord) []int {
	if n.AgentMountNS == "" {
		return nil
	}
	netns := ""
	var st syscall.Stat_t
	if n.NetNS != "" && syscall.Stat("/run/netns/"+n.NetNS, &st) == nil {
		netns = fmt.Sprintf("net:[%d]", st.Ino)
	}
	pids := pidsInMountNS(n.AgentMountNS)
	for _, pid := range pids {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && netns != "" && ns == netns {
			return pids
		}
		if info, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid)); err == nil && mountsNodeRoot(info, n.Dir) {
			return pids
		}
	}
	return nil
}

// mountsNodeRoot reports whether mountinfo (/proc/<pid>/mountinfo) shows
// the node agent's bind mount of the node in dir: its root/etc/kubernetes
// over /etc/kubernetes. A mount's root is its path within its file system,
// so it ends dir's path when dir is not on the root file system.
func mountsNodeRoot(mountinfo []byte, dir string) bool {
	for line := range strings.Lines(string(mountinfo)) {
		fields := strings.Fields(line)
		if len(fields) < 5 || fields[4] != "/etc/kubernetes" {
			continue
		}
		// A removed directory's mounts show as "<path>//deleted".
		base, ok := strings.CutSuffix(strings.TrimSuffix(fields[3], "//deleted"), "/root/etc/kubernetes")
		if ok && base != "" && (base == dir || strings.HasSuffix(dir, base) && strings.HasPrefix(base, "/")) {
			return true
		}
	}
	return false
}

// pidsInMountNS returns every process in mount namespace ns.
func pidsInMountNS(ns string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if got, err := mountNS(pid); err == nil && got == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// NodeProcesses returns the processes of node n of a local cluster's record:
// those in its mount namespace while that is still its (nodeMountNSPIDs).
// None are left after `gatehouse mini down` or `mini stop`.
func NodeProcesses(n NodeRecord) []int { return nodeMountNSPIDs(n) }

// inotifyInstancesPath is the kernel's limit of inotify instances per user
// (proc(5)); every process of every local cluster runs as root and counts
// against the one limit.
const inotifyInstancesPath = "/proc/sys/fs/inotify/max_user_instances"

// minInotifyInstances is what raiseSysctl sets fs.inotify.max_user_instances
// to when it is lower: a node's kubelet, containerd and their plugins hold
// about 11 inotify instances (a 1 + 2 cluster 35, docs/benchmarks.md, "Local
// cluster"), so the kernel's default of 128 runs out with a user's cluster
// and the end-to-end test's side by side, and containerd's CRI plugin then
// fails with "too many open files". 1024 is what kind tells its users to set.
const minInotifyInstances = 1024

// raiseSysctl sets the integer sysctl at path to at least min. It returns
// the value it found and whether it raised it.
func raiseSysctl(path string, min int) (was int, raised bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false, fmt.Errorf("reading %s: %w", path, err)
	}
	was, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, false, fmt.Errorf("reading %s: %q is not a number: %w", path, b, err)
	}
	if was >= min {
		return was, false, nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(min)+"\n"), 0o644); err != nil { //nolint:gosec // a sysctl
		return was, false, fmt.Errorf("raising %s from %d to %d (needed for more than a few local nodes): %w", path, was, min, err)
	}
	return was, true, nil
}
