package mini

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Network is where a local cluster lives on the host, so that clusters on
// different networks run side by side (a user's cluster and the end-to-end
// test's): network n is the bridge ghmini<n> with 10.88.<n>.0/24 (the host
// .1, where the registry listens; the load balancer .2; node i .10+i), and
// every host-wide name the cluster makes (network namespaces, host veths,
// cgroup roots, device-mapper names) carries n. Network 0's names are those
// of clusters made before networks were numbered. Everything else a node
// uses is private to it: its mount namespace (/run/containerd, /var/lib/kubelet,
// …), its network namespace (ports, iptables, routes, pod ranges) and its
// cluster directory.
type Network int

// DefaultNetwork is `gatehouse mini up`'s network; the end-to-end test
// takes another (FreeNetwork).
const DefaultNetwork Network = 0

// MaxNetwork is the highest network number (10.88.<n>.0/24).
const MaxNetwork Network = 254

// bridgePrefix names the bridges of every network.
const bridgePrefix = "ghmini"

// Valid reports an error for a network number out of range.
func (n Network) Valid() error {
	if n < 0 || n > MaxNetwork {
		return fmt.Errorf("--network %d: a local cluster's network is 0 to %d (10.88.<network>.0/24)", n, MaxNetwork)
	}
	return nil
}

// Bridge is the network's bridge on the host.
func (n Network) Bridge() string { return bridgePrefix + strconv.Itoa(int(n)) }

// prefix is the network's /24 without its last octet.
func (n Network) prefix() string { return fmt.Sprintf("10.88.%d", n) }

// CIDR is the network's address range.
func (n Network) CIDR() string { return n.prefix() + ".0/24" }

// HostIP is the host's address on the bridge: the nodes' gateway and the
// registry's address.
func (n Network) HostIP() string { return n.prefix() + ".1" }

// LoadBalancerIP is where the API servers' load balancer listens (more than
// one control plane).
func (n Network) LoadBalancerIP() string { return n.prefix() + ".2" }

// RegistryAddress is the local image registry: images are named
// RegistryAddress/<repository>:<tag>.
func (n Network) RegistryAddress() string { return n.HostIP() + ":5000" }

// NodeIP is node i's address.
func (n Network) NodeIP(i int) string { return fmt.Sprintf("%s.%d", n.prefix(), 10+i) }

// loadBalancerEndpoint is the controlPlaneEndpoint the load balancer serves.
func (n Network) loadBalancerEndpoint() string {
	return net.JoinHostPort(n.LoadBalancerIP(), strconv.Itoa(apiServerPort))
}

// hostName is node's name for what it owns on the host: its network
// namespace and cgroup root ("gh-cp-0" on network 0, "gh1-cp-0" on 1).
func (n Network) hostName(node string) string {
	if n == 0 {
		return "gh-" + node
	}
	return fmt.Sprintf("gh%d-%s", n, node)
}

// hostVeth is the host end of node's link to the bridge; at most 15
// characters ("ghc0h", "gh12h" on network 0; "gh1-c0h", "gh1-12h" on 1:
// only other networks' names hold a dash).
func (n Network) hostVeth(node string) string {
	short := strings.ReplaceAll(strings.TrimPrefix(node, "worker-"), "cp-", "c")
	if n == 0 {
		return "gh" + short + "h"
	}
	return fmt.Sprintf("gh%d-%sh", n, short)
}

// stateMapperName is the device-mapper name of node's opened state disk,
// unique on the machine (where device-mapper exists).
func (n Network) stateMapperName(node string) string {
	if n == 0 {
		return "gatehouse-state-" + node
	}
	return "gatehouse-state-" + n.hostName(node)
}

// linkNames lists the host's network interfaces; a variable for tests.
var linkNames = func() ([]string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, i := range ifaces {
		names = append(names, i.Name)
	}
	return names, nil
}

// runningNetworks lists the networks whose bridge exists: a local cluster
// runs there, or one was not removed.
func runningNetworks() ([]Network, error) {
	names, err := linkNames()
	if err != nil {
		return nil, err
	}
	var out []Network
	for _, name := range names {
		num, ok := strings.CutPrefix(name, bridgePrefix)
		if !ok {
			continue
		}
		if i, err := strconv.Atoi(num); err == nil && strconv.Itoa(i) == num && Network(i).Valid() == nil {
			out = append(out, Network(i))
		}
	}
	slices.Sort(out)
	return out, nil
}

// FreeNetwork returns the first network from from on whose bridge does not
// exist.
func FreeNetwork(from Network) (Network, error) {
	running, err := runningNetworks()
	if err != nil {
		return 0, err
	}
	for n := from; n <= MaxNetwork; n++ {
		if !slices.Contains(running, n) {
			return n, nil
		}
	}
	return 0, fmt.Errorf("every local cluster network from %d to %d is taken (bridges %s%d..%s%d)", from, MaxNetwork, bridgePrefix, from, bridgePrefix, MaxNetwork)
}

// aliasPrefix starts the alias of a cluster's bridge, which names the
// cluster's directory, so a refusal says which cluster holds a network.
const aliasPrefix = "gatehouse mini "

// bridgeDir returns the directory of the cluster whose bridge is bridge,
// from the bridge's alias ("" when unknown).
var bridgeDir = func(bridge string) string {
	alias, err := os.ReadFile(filepath.Join("/sys/class/net", bridge, "ifalias"))
	if err != nil {
		return ""
	}
	dir, _ := strings.CutPrefix(strings.TrimSpace(string(alias)), aliasPrefix)
	return dir
}

// networkFree returns an error saying what to do when network n's bridge
// exists: another local cluster runs there (or was not removed).
func networkFree(n Network) error {
	running, err := runningNetworks()
	if err != nil {
		return err
	}
	if !slices.Contains(running, n) {
		return nil
	}
	owner, down := "another local cluster", "`gatehouse mini down --dir <its directory>`"
	if dir := bridgeDir(n.Bridge()); dir != "" {
		owner = "the local cluster in " + dir
		down = "`gatehouse mini down" + dirFlag(dir) + "`"
		if dir == DefaultDir {
			down += " (make mini-down)"
		}
	}
	next := "another network"
	if free, err := FreeNetwork(0); err == nil {
		next = fmt.Sprintf("--network %d, which is free", free)
	}
	return fmt.Errorf("network %d (bridge %s, %s) is taken by %s: remove that cluster with %s, or start this one on %s",
		n, n.Bridge(), n.CIDR(), owner, down, next)
}

// dirFlag is the --dir flag naming dir, or nothing for the default.
func dirFlag(dir string) string {
	if dir == DefaultDir {
		return ""
	}
	return " --dir " + dir
}

// createNetwork creates the cluster bridge, the host's address on it, the
// API servers' load balancer when there is more than one control plane,
// and the init secret files.
func (u *up) createNetwork(ctx context.Context) (initSecret, error) {
	nw := u.opts.Network
	u.p.step("Creating the cluster network (bridge %s, %s)", nw.Bridge(), nw.CIDR())
	if err := run(ctx, "ip", "link", "add", nw.Bridge(), "type", "bridge"); err != nil {
		// Another `mini up` on this network took it since the preflight.
		if nerr := networkFree(nw); nerr != nil {
			return initSecret{}, nerr
		}
		return initSecret{}, err
	}
	u.rec.Bridge = nw.Bridge()
	if err := u.rec.save(); err != nil {
		return initSecret{}, err
	}
	for _, args := range [][]string{
		// The alias names the cluster, for another mini up's refusal.
		{"link", "set", "dev", nw.Bridge(), "alias", aliasPrefix + u.opts.Dir},
		{"addr", "add", nw.HostIP() + "/24", "dev", nw.Bridge()},
		{"link", "set", nw.Bridge(), "up"},
	} {
		if err := run(ctx, "ip", args...); err != nil {
			return initSecret{}, err
		}
	}
	if u.opts.ControlPlanes > 1 {
		var backends []string
		for i := range u.opts.ControlPlanes {
			backends = append(backends, nw.NodeIP(i))
		}
		u.p.step("Starting the API servers' load balancer (haproxy) at %s for %d control planes", nw.loadBalancerEndpoint(), len(backends))
		if err := startLoadBalancer(ctx, u.rec, backends); err != nil {
			return initSecret{}, err
		}
	}
	file, hashFile, err := initSecretFiles(u.opts.Dir)
	return initSecret{file: file, hashFile: hashFile}, err
}
