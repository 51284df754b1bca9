package mini

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNetworkNames: network 0 keeps the names of clusters made before
// networks were numbered, and no host-wide name of one network's node is
// another's, on any network, for every node a cluster can have; host
// veths fit the kernel's 15 characters.
func TestNetworkNames(t *testing.T) {
	n0 := DefaultNetwork
	for got, want := range map[string]string{
		n0.Bridge(): "ghmini0", n0.CIDR(): "10.88.0.0/24", n0.HostIP(): "10.88.0.1", n0.LoadBalancerIP(): "10.88.0.2",
		n0.RegistryAddress(): "10.88.0.1:5000", n0.NodeIP(0): "10.88.0.10", n0.NodeIP(2): "10.88.0.12",
		n0.hostName("cp-0"): "gh-cp-0", n0.hostVeth("cp-0"): "ghc0h", n0.hostVeth("worker-12"): "gh12h",
		n0.stateMapperName("worker-1"): "gatehouse-state-worker-1", n0.loadBalancerEndpoint(): "10.88.0.2:6443",
	} {
		if got != want {
			t.Errorf("network 0: got %q, want %q", got, want)
		}
	}
	if got := Network(7).RegistryAddress(); got != "10.88.7.1:5000" {
		t.Errorf("network 7's registry is at %q", got)
	}

	var nodes []string
	for i := range MaxControlPlanes {
		nodes = append(nodes, fmt.Sprintf("cp-%d", i))
	}
	for i := 1; i <= MaxWorkers; i++ {
		nodes = append(nodes, fmt.Sprintf("worker-%d", i))
	}
	seen := map[string]string{}
	claim := func(kind, name, owner string) {
		t.Helper()
		key := kind + ":" + name
		if other, ok := seen[key]; ok {
			t.Errorf("%s %q is both %s's and %s's", kind, name, other, owner)
		}
		seen[key] = owner
	}
	for _, n := range []Network{0, 1, 2, 11, 12, MaxNetwork} {
		claim("bridge", n.Bridge(), fmt.Sprint("network ", n))
		claim("address", n.HostIP(), fmt.Sprint("network ", n))
		claim("address", n.LoadBalancerIP(), fmt.Sprint("network ", n))
		for i, node := range nodes {
			owner := fmt.Sprintf("%s on network %d", node, n)
			claim("netns/cgroup", n.hostName(node), owner)
			claim("link", n.hostVeth(node), owner)
			claim("dm", n.stateMapperName(node), owner)
			claim("address", n.NodeIP(i), owner)
			if v := n.hostVeth(node); len(v) > 15 {
				t.Errorf("%s's host veth %q is longer than 15 characters", owner, v)
			}
		}
	}
	if err := (MaxNetwork + 1).Valid(); err == nil {
		t.Error("network 255 is valid")
	}
	if err := Network(-1).Valid(); err == nil {
		t.Error("network -1 is valid")
	}
}

// fakeLinks makes the host's interfaces names and each bridge's cluster
// directory dirs, for the test.
func fakeLinks(t *testing.T, names []string, dirs map[string]string) {
	t.Helper()
	links, dir := linkNames, bridgeDir
	t.Cleanup(func() { linkNames, bridgeDir = links, dir })
	linkNames = func() ([]string, error) { return names, nil }
	bridgeDir = func(bridge string) string { return dirs[bridge] }
}

// TestNetworkTaken: a network whose bridge exists is refused before
// anything is made, naming the cluster that holds it, how to remove that
// one and a free network to use instead; the end-to-end test's choice
// skips taken networks.
func TestNetworkTaken(t *testing.T) {
	fakeLinks(t, []string{"lo", "eth0", "ghmini0", "ghmini2", "ghminix", "ghmini01", "ghc0h"},
		map[string]string{"ghmini0": DefaultDir, "ghmini2": "/tmp/TestMiniCluster1/001/mini"})
	running, err := runningNetworks()
	if err != nil || !slices.Equal(running, []Network{0, 2}) {
		t.Fatalf("running networks %v (%v), want [0 2]", running, err)
	}
	for from, want := range map[Network]Network{0: 1, 1: 1, 2: 3} {
		if got, err := FreeNetwork(from); err != nil || got != want {
			t.Errorf("FreeNetwork(%d) = %d, %v; want %d", from, got, err, want)
		}
	}

	tests := []struct {
		network Network
		want    []string // in the refusal; none: accepted
	}{
		{0, []string{"network 0 (bridge ghmini0, 10.88.0.0/24) is taken by the local cluster in /var/lib/gatehouse-mini",
			"`gatehouse mini down` (make mini-down)", "--network 1, which is free"}},
		{2, []string{"taken by the local cluster in /tmp/TestMiniCluster1/001/mini",
			"`gatehouse mini down --dir /tmp/TestMiniCluster1/001/mini`", "--network 1"}},
		{1, nil},
	}
	for _, tt := range tests {
		u := &up{opts: Options{Dir: filepath.Join(t.TempDir(), "mini"), Network: tt.network, ControlPlanes: 1, Workers: 2}}
		err := u.preflight()
		if tt.want == nil {
			// The network is free: what fails (if anything) comes later.
			if err != nil && strings.Contains(err.Error(), "is taken") {
				t.Errorf("network %d: refused as taken: %v", tt.network, err)
			}
			continue
		}
		if err == nil {
			t.Fatalf("network %d: accepted while its bridge exists", tt.network)
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("network %d: the refusal lacks %q:\n%v", tt.network, w, err)
			}
		}
	}

	// A bridge made by an older mini up names no directory.
	fakeLinks(t, []string{"ghmini0"}, nil)
	err = (&up{opts: Options{Dir: t.TempDir(), ControlPlanes: 1}}).preflight()
	if err == nil || !strings.Contains(err.Error(), "taken by another local cluster: remove that cluster with `gatehouse mini down --dir <its directory>`") {
		t.Errorf("refusal without a known directory: %v", err)
	}
}

// TestDownKeepsSharedMountpoints: Down removes the host directories its
// nodes created as mountpoints only when no other local cluster runs; a
// running one's nodes have bind mounts on them.
func TestDownKeepsSharedMountpoints(t *testing.T) {
	for _, other := range []bool{true, false} {
		t.Run(fmt.Sprint("another cluster runs: ", other), func(t *testing.T) {
			links := []string{"lo", "ghmini0"} // this cluster's own bridge does not count
			if other {
				links = append(links, "ghmini3")
			}
			fakeLinks(t, links, nil)
			dir := filepath.Join(t.TempDir(), "mini")
			mountpoint := filepath.Join(t.TempDir(), "etc-kubernetes")
			node := filepath.Join(dir, "nodes", "worker-1")
			if err := os.MkdirAll(node, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(mountpoint, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(node, mountpointsFile), []byte(mountpoint), 0o600); err != nil {
				t.Fatal(err)
			}
			rec := &Record{Dir: dir, Nodes: []NodeRecord{{Name: "worker-1", Dir: node}}}
			if err := rec.save(); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := Down(t.Context(), dir, &out); err != nil {
				t.Fatalf("Down: %v\n%s", err, out.String())
			}
			_, err := os.Stat(mountpoint)
			if kept := err == nil; kept != other {
				t.Errorf("the mountpoint kept: %v, want %v", kept, other)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("the cluster directory remains: %v", err)
			}
		})
	}
}

// TestHaproxyConfig: Debian's haproxy accepts the load balancer's
// configuration (haproxy -c), every API server is health-checked, and a
// server taken out has its connections closed, so kubelets reconnect at
// once instead of stalling on an API server that restarts.
func TestHaproxyConfig(t *testing.T) {
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatalf("haproxy is not installed (make setup installs it): %v", err)
	}
	config := haproxyConfig(Network(3), []string{"10.88.3.10", "10.88.3.11", "10.88.3.12"})
	file := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(haproxy, "-c", "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s\n%s", err, out, config)
	}
	for _, want := range []string{"on-marked-down shutdown-sessions", "server 10.88.3.12 10.88.3.12:6443 check", "http-check send meth GET uri /readyz"} {
		if !strings.Contains(config, want) {
			t.Errorf("the configuration lacks %q:\n%s", want, config)
		}
	}
}
