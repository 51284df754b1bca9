package mini

import (
	"context"
	"io"
	"time"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

// DefaultDir is where a local cluster keeps its state.
const DefaultDir = "/var/lib/gatehouse-mini"

// Options configure Up.
type Options struct {
	// Dir is the cluster directory (DefaultDir).
	Dir string
	// Release, if set, are a verified release's service images and charts
	// (gatehouse mini up --release): used instead of images built from
	// BinDir's binaries and the charts built into the CLI.
	Release *ReleaseServices
	// Network is where the cluster lives on the host (DefaultNetwork): its
	// bridge, addresses and host-wide names. Clusters on different networks
	// run side by side.
	Network Network
	// ControlPlanes is the number of control planes (1, at most
	// MaxControlPlanes). With more than one, an haproxy load balancer is
	// the cluster's controlPlaneEndpoint and control planes 2..N join
	// through the join service with kubeadm join --control-plane.
	ControlPlanes int
	// Workers is the number of worker nodes (2, at most MaxWorkers).
	Workers int
	// KubeletCertLifetime is the cluster's kubeletCertificateLifetime
	// (0: its default, 24 h). Kubelets renew at 70-90 % of it through CSRs
	// the join service approves after fresh evidence.
	KubeletCertLifetime time.Duration
	// BinDir holds gatehouse, gatehouse-bootstrapper, gatehouse-joinservice,
	// gatehouse-keyservice and gatehouse-pause.
	BinDir string
	// KubeBinDir holds the pinned Kubernetes binaries (hack/kube-binaries.sh).
	KubeBinDir string
	// AddonBinDir holds CoreDNS and the registry, built from their pinned
	// modules (hack/addon-binaries.sh).
	AddonBinDir string
	// KubernetesVersion is the version those binaries are.
	KubernetesVersion string
	// UpgradeKubeBinDirs hold later Kubernetes builds (the next minor
	// version's, hack/kube-binaries.sh) the cluster may be upgraded to
	// with `gatehouse upgrade apply --kubernetes`: the nodes carry their
	// images too, as a node image carries what its cluster may move to.
	UpgradeKubeBinDirs []string
	// ImageCache, when set, is the directory of built image archives,
	// kept by the digests of everything in them (images.Cache): a
	// second Up with the same binaries skips the image build.
	ImageCache string
	// BootManifest, when set, changes what node measures at boot (its boot
	// manifest, given as the cluster's reference value). A node whose
	// manifest differs fails attestation and is not waited for; the CLI's
	// hidden --tamper flag uses this to show a refused node.
	BootManifest func(node string, manifest []byte) []byte
	// Out receives progress.
	Out io.Writer
	// MirrorImages makes the nodes pull every image from the cluster's
	// registry as the mirror of the cluster configuration
	// (mirrorimages.go), instead of importing the local images.
	MirrorImages bool
	// Provider names the node provider of every node (ProviderNetNS when
	// empty, or ProviderQEMU).
	Provider string
	// VMWorkers is how many of the workers, the last ones, are VMs of the
	// node image (ProviderQEMU) whatever Provider says: a mixed cluster.
	// At most Workers.
	VMWorkers int
	// NodeImage is the node image's directory (hack/node-image.sh prints
	// it; docs/image.md), which qemu nodes boot; needed with any, and given
	// when the cluster will get VM nodes later (`mini node add --provider
	// qemu`): the join policy then accepts the image's signed values for
	// each role beside the namespace nodes' (acceptVMNodes).
	NodeImage string
	// Init initialises the cluster as `gatehouse init` does: it verifies the
	// node at node against the configuration at config and writes the
	// admin kubeconfig, state and master secret files into dir. It prints
	// its progress to out.
	Init func(ctx context.Context, dir, config, node, initSecretFile string, components []*componentsv1.Component, out io.Writer) error
}

// Limits of a local cluster's size: node addresses and pod ranges are
// numbered in one /24 each.
const (
	MaxControlPlanes = 7
	MaxWorkers       = 20
)
