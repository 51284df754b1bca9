package mini

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// Record lists everything Up created, so Down removes every process,
// namespace, link, loop device, cgroup and file. It is saved after each
// change (mini.json in the cluster directory).
type Record struct {
	Created time.Time `json:"created"`
	Dir     string    `json:"dir"`
	// Network is where the cluster lives on the host; its Bridge is made.
	Network    Network `json:"network,omitempty"`
	Bridge     string  `json:"bridge,omitempty"`
	Kubeconfig string  `json:"kubeconfig,omitempty"`
	// JoinEndpoints and CACertHash are what a joining node is given: every
	// control plane's join service and the cluster CA's hash.
	JoinEndpoints []string `json:"joinEndpoints,omitempty"`
	CACertHash    string   `json:"caCertHash,omitempty"`
	// LoadBalancerPID is the API servers' haproxy (more than one control plane).
	LoadBalancerPID int `json:"loadBalancerPID,omitempty"`
	// RegistryPID is the local image registry (Network.RegistryAddress).
	RegistryPID int `json:"registryPID,omitempty"`
	// MirrorPID is the mirror's file server the nodes download their
	// components from (mirror.go).
	MirrorPID int `json:"mirrorPID,omitempty"`
	// NodeImage is the node image's directory the cluster's qemu nodes
	// boot (Options.NodeImage); empty without one.
	NodeImage string       `json:"nodeImage,omitempty"`
	Nodes     []NodeRecord `json:"nodes"`
}

// NodeRecord is what one node owns on the host.
type NodeRecord struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
	// Provider names the Provider that made the node's machine
	// (ProviderNetNS when empty: records made before providers existed).
	Provider   string `json:"provider,omitempty"`
	NetNS      string `json:"netns,omitempty"`
	HostVeth   string `json:"hostVeth,omitempty"`
	LoopDevice string `json:"loopDevice,omitempty"`
	// CgroupRoot is created in every cgroup hierarchy.
	CgroupRoot string `json:"cgroupRoot,omitempty"`
	AgentPID   int    `json:"agentPID,omitempty"`
	// AgentMountNS identifies the node's mount namespace (mnt:[inode]);
	// every process in it belongs to the node.
	AgentMountNS string `json:"agentMountNS,omitempty"`
}

func recordPath(dir string) string { return filepath.Join(dir, "mini.json") }

// ReadRecord returns the record in dir, or fs.ErrNotExist.
func ReadRecord(dir string) (*Record, error) {
	data, err := os.ReadFile(recordPath(dir))
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", recordPath(dir), err)
	}
	return &r, nil
}

func (r *Record) save() error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(recordPath(r.Dir), append(data, '\n'), 0o600)
}

func (r *Record) node(name string) *NodeRecord {
	for i := range r.Nodes {
		if r.Nodes[i].Name == name {
			return &r.Nodes[i]
		}
	}
	r.Nodes = append(r.Nodes, NodeRecord{Name: name})
	return &r.Nodes[len(r.Nodes)-1]
}

// exists reports whether a cluster is recorded in dir.
func exists(dir string) (bool, error) {
	_, err := os.Stat(recordPath(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
