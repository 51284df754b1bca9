// Package mini runs a local attested Kubernetes cluster on one Linux
// machine (`gatehouse mini up`): every node has its own network namespace
// and address, a private mount namespace, its own containerd, kubelet,
// cgroup root, software TPM and LUKS2 state disk, and runs the real
// gatehouse-bootstrapper, which runs the real kubeadm. docs/quickstart.md
// shows what a user sees; docs/development.md ("Real kubelets in
// namespaces") the recipe.
package mini

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// NodeSpec is what a node agent needs, written by Up as node.json.
type NodeSpec struct {
	Name string `json:"name"`
	// Network is the cluster's network; IP is the node's address on its
	// bridge.
	Network Network `json:"network,omitempty"`
	IP      string  `json:"ip"`
	// Gateway is the bridge's address on the host.
	Gateway string `json:"gateway"`
	// Dir is the node's directory on the host.
	Dir string `json:"dir"`
	// NetNS names the node's network namespace (/run/netns/<NetNS>).
	NetNS string `json:"netns"`
	// ControlPlane and Init: the first control plane is initialised by
	// `gatehouse init`; the others join.
	ControlPlane bool `json:"controlPlane"`
	Init         bool `json:"init"`
	// StateDisk is the loop device of the node's LUKS2 state disk.
	StateDisk string `json:"stateDisk"`
	// BinDir holds the gatehouse binaries, KubeBinDir the pinned Kubernetes ones.
	BinDir     string `json:"binDir"`
	KubeBinDir string `json:"kubeBinDir"`
	// UpgradeKubeBinDirs are the later builds the cluster may be upgraded
	// to (Options.UpgradeKubeBinDirs): an upgraded kubelet runs from there.
	UpgradeKubeBinDirs []string `json:"upgradeKubeBinDirs,omitempty"`
	// Images is the image archive imported into the node's containerd, and
	// PauseImage the sandbox image among them.
	Images     string `json:"images"`
	PauseImage string `json:"pauseImage"`
	// ImagesDigest is the archive's sha256, and ImagesSeed a containerd
	// root with its images imported and unpacked (a containerd seed),
	// which the node's containerd starts from when it can be linked;
	// empty without one.
	ImagesDigest string `json:"imagesDigest,omitempty"`
	ImagesSeed   string `json:"imagesSeed,omitempty"`
	// MirrorImages: the node imports no images and pulls every one from
	// the cluster's mirror registry (mirrorimages.go).
	MirrorImages bool `json:"mirrorImages,omitempty"`
	// PodCIDR is the node's pod range for its CNI bridge.
	PodCIDR string `json:"podCIDR"`
	// CgroupRoot is the node's kubelet cgroup root.
	CgroupRoot string `json:"cgroupRoot"`
	// BootManifest is what the node measures into PCR 4 besides the
	// bootstrapper binary (a tampered node measures something else).
	BootManifest []byte `json:"bootManifest"`
	// JoinEndpoints and CACertHash: where and whom to join (empty on the
	// init node).
	JoinEndpoints []string `json:"joinEndpoints,omitempty"`
	// CloudMetadata, when set, is the cloud whose instance metadata the
	// node's bootstrapper reads at cloudMetadataIP (WorkerOptions).
	CloudMetadata string `json:"cloudMetadata,omitempty"`
	CACertHash    string `json:"caCertHash,omitempty"`
	// InitSecretHashFile holds the bcrypt hash of the init secret.
	InitSecretHashFile string `json:"initSecretHashFile"`
	// TPMCA is the directory of the local TPM manufacturer's CA
	// (swtpm.LocalCA) that issues the node TPM's EK certificate.
	TPMCA string `json:"tpmCA"`
	// SeedDisk is a VM node's NoCloud seed disk holding its user data
	// (WorkerOptions.UserData); empty for a node mini provisions.
	SeedDisk string `json:"seedDisk,omitempty"`
}

// ImageRepository is where the local images are named (never pulled).
const ImageRepository = "docker.io/local"

// Ports the node services listen on at the node's address.
const (
	initPort     = 9000
	evidencePort = 9001
	joinPort     = 9090
)

// rolePCR is where a local node measures its role, as a boot loader
// measures the kernel command line into PCR 8.
const rolePCR = 8

// PCRs the local cluster's nodes quote: the node image's bootstrapper's
// selection (docs/image.md), which covers the boot loader PCR (4, where a
// namespace node measures its bootstrapper), the role PCR and the node
// lock. Namespace and VM nodes quote the same PCRs, as one policy's
// selection is exact; a namespace node's others stay zero.
var PCRs = []int{0, 1, 2, 3, 4, 5, 6, 7, rolePCR, 9, 11, 12, 13, 15}

// ReadNodeSpec reads node.json.
func ReadNodeSpec(path string) (*NodeSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s NodeSpec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}

func (s *NodeSpec) write() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	// The node's agent may read it meanwhile (it waits for JoinEndpoints).
	return atomicfile.Write(filepath.Join(s.Dir, "node.json"), data, 0o600)
}

// rootDir is where the node's private directories live on the host.
func (s *NodeSpec) rootDir() string { return filepath.Join(s.Dir, "root") }

// logDir holds the logs of the node's processes.
func (s *NodeSpec) logDir() string { return filepath.Join(s.Dir, "logs") }

// tpmSocket is the node's swtpm socket.
func (s *NodeSpec) tpmSocket() string { return filepath.Join(s.Dir, "tpm", "tpm.sock") }
