package mini

import (
	"bytes"
	"fmt"
	"net"
	"path/filepath"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
)

// plannedNode is one node Up makes: its specification and the provider
// that makes its machine.
type plannedNode struct {
	spec     *NodeSpec
	provider Provider
}

// clusterPlan is every node Up makes: the first control plane, which
// `gatehouse init` initialises, and the nodes that join (the other
// control planes, then the workers).
type clusterPlan struct {
	init    *plannedNode
	joiners []*plannedNode
}

// all is every node, the first control plane first.
func (c *clusterPlan) all() []*plannedNode { return append([]*plannedNode{c.init}, c.joiners...) }

// nodeBase is what every node of a cluster is given: the images, the TPM
// manufacturer and the init secret's hash.
type nodeBase struct {
	images   *nodeImages
	tpmCA    swtpm.LocalCA
	hashFile string
}

// planNodes names and places every node of the cluster and chooses its
// provider: Options.Provider, but the last Options.VMWorkers workers are
// qemu nodes.
func (u *up) planNodes(base nodeBase) *clusterPlan {
	plan := &clusterPlan{}
	total := u.opts.ControlPlanes + u.opts.Workers
	for i := range total {
		var s *NodeSpec
		if i < u.opts.ControlPlanes {
			s = u.newSpec(base, i, fmt.Sprintf("cp-%d", i))
			s.ControlPlane, s.Init = true, i == 0
		} else {
			s = u.newSpec(base, i, fmt.Sprintf("worker-%d", i-u.opts.ControlPlanes+1))
		}
		name := u.opts.Provider
		if name == "" {
			name = ProviderNetNS
		}
		if !s.ControlPlane && i >= total-u.opts.VMWorkers {
			name = ProviderQEMU
		}
		n := &plannedNode{spec: s, provider: u.providers[name]}
		if i == 0 {
			plan.init = n
		} else {
			plan.joiners = append(plan.joiners, n)
		}
	}
	return plan
}

// providerNames are the providers the options choose, the default's
// first.
func (o Options) providerNames() []string {
	name := o.Provider
	if name == "" {
		name = ProviderNetNS
	}
	names := []string{name}
	if o.VMWorkers > 0 && name != ProviderQEMU {
		names = append(names, ProviderQEMU)
	}
	return names
}

// newSpec is node i's specification; the hook in Options may change what
// it measures at boot.
func (u *up) newSpec(base nodeBase, i int, name string) *NodeSpec {
	manifest := base.images.manifest
	if u.opts.BootManifest != nil {
		manifest = u.opts.BootManifest(name, bytes.Clone(manifest))
	}
	s := &NodeSpec{
		Network: u.opts.Network, Gateway: u.opts.Network.HostIP(), BinDir: u.opts.BinDir, KubeBinDir: u.opts.KubeBinDir, UpgradeKubeBinDirs: u.opts.UpgradeKubeBinDirs,
		Images: base.images.archive, PauseImage: base.images.pause, ImagesDigest: base.images.digest, ImagesSeed: base.images.seed,
		BootManifest: manifest, InitSecretHashFile: base.hashFile, TPMCA: base.tpmCA.Dir,
	}
	s.place(u.opts.Dir, i, name)
	u.mirrorImagesSpec(s)
	return s
}

// place makes s node i of the cluster in dir on s.Network, named name:
// its address, pod range, directory, namespace and cgroup.
func (s *NodeSpec) place(dir string, i int, name string) {
	s.Name, s.IP, s.PodCIDR = name, s.Network.NodeIP(i), podCIDR(i)
	s.Dir, s.NetNS, s.CgroupRoot = filepath.Join(dir, "nodes", name), s.Network.hostName(name), "/"+s.Network.hostName(name)
}

// podCIDR is node i's pod range; pod ranges are private to a cluster's
// nodes (routed on its bridge only), so every network uses the same.
func podCIDR(i int) string { return fmt.Sprintf("10.244.%d.0/24", i) }

// controlPlaneEndpoint is the cluster's controlPlaneEndpoint: the load
// balancer with more than one control plane, else the first one's API
// server.
func (u *up) controlPlaneEndpoint() string {
	if u.opts.ControlPlanes > 1 {
		return u.opts.Network.loadBalancerEndpoint()
	}
	return net.JoinHostPort(u.opts.Network.NodeIP(0), fmt.Sprint(apiServerPort))
}

// joinEndpoints are every control plane's join service: one answers
// while others are not up yet or down.
func (u *up) joinEndpoints() []string {
	var endpoints []string
	for i := range u.opts.ControlPlanes {
		endpoints = append(endpoints, net.JoinHostPort(u.opts.Network.NodeIP(i), fmt.Sprint(joinPort)))
	}
	return endpoints
}
