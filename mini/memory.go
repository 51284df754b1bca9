package mini

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// What a network-namespace node does to need less memory
// (docs/benchmarks.md, "Memory of the local cluster"). These are the local
// cluster's settings, not a production node's: every node of a local
// cluster runs on one machine and shares its kernel, so the cluster's
// memory is the sum of its nodes', and CPU spent on collecting garbage
// sooner is cheaper there than memory.

// installedKubelet is where the bootstrapper installs the kubelet (the
// versions table's install path).
const installedKubelet = "/usr/local/bin/kubelet"

// nodeGOGC is the Go garbage collector's setting (GOGC, percent of the
// live heap a heap may grow by before the next collection; Go's default
// is 100) of a network-namespace node's agent and of every process it
// starts, which inherit its environment: containerd and its shims, the
// kubelet, the bootstrapper and its evidence server. Each of them then
// holds about a quarter less heap for some more collections; the
// measurement is in docs/benchmarks.md.
const nodeGOGC = "GOGC=50"

// controlPlaneGOGC is the same for the control-plane components' static
// Pods (kube-apiserver, kube-controller-manager, kube-scheduler, etcd).
const controlPlaneGOGC = "50"

// controlPlaneEnvArgs are the bootstrapper's flags that give the
// control-plane components controlPlaneGOGC: on kubeadm init it puts them
// into kubeadm's ClusterConfiguration, which every control plane that
// joins renders its static Pods from.
func controlPlaneEnvArgs() []string {
	var args []string
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"} {
		args = append(args, "--control-plane-env", c+":GOGC="+controlPlaneGOGC)
	}
	return args
}

// kubeletBinary returns the kubelet the agent runs: a host kubelet, the
// host's pinned Kubernetes build, when the kubelet the bootstrapper
// installed (installed) has the same bytes, else installed. The installed
// kubelet is a copy of that very build (mirrorComponents: the mirror's URL
// and its sha256) in the node's private /usr/local/bin; run from there, every
// node's kubelet would hold its own copy of the 150 MB multi-call
// binary's code in memory, about 95 MiB per node. Run from the host's
// file, the nodes' kubelets share one copy, as nodes sharing one kernel
// and its page cache can (real nodes have one kubelet each). A kubelet
// installed from anything else, or one that cannot be compared, runs as
// installed.
//
// After `gatehouse upgrade apply --kubernetes` the installed kubelet is
// the upgrade build's, so each of hostKubelets (the cluster's build, then
// the upgrade builds') is compared in turn.
func kubeletBinary(installed string, hostKubelets ...string) string {
	for _, host := range hostKubelets {
		if same, err := sameBytes(installed, host); err == nil && same {
			return host
		}
	}
	return installed
}

// sameBytes reports whether the files at a and b (symbolic links
// followed) have the same content.
func sameBytes(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	sa, err := fa.Stat()
	if err != nil {
		return false, err
	}
	sb, err := fb.Stat()
	if err != nil {
		return false, err
	}
	if sa.Size() != sb.Size() {
		return false, nil
	}
	if os.SameFile(sa, sb) {
		return true, nil
	}
	const chunk = 1 << 20
	ba, bb := make([]byte, chunk), make([]byte, chunk)
	for {
		na, errA := io.ReadFull(fa, ba)
		nb, errB := io.ReadFull(fb, bb)
		if !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		endA, endB := isEOF(errA), isEOF(errB)
		switch {
		case errA != nil && !endA:
			return false, fmt.Errorf("reading %s: %w", a, errA)
		case errB != nil && !endB:
			return false, fmt.Errorf("reading %s: %w", b, errB)
		case endA || endB:
			return endA && endB, nil
		}
	}
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// hostKubelets are the kubelets of the Kubernetes builds on the host: the
// cluster's, then those it may be upgraded to.
func (s *NodeSpec) hostKubelets() []string {
	out := []string{filepath.Join(s.KubeBinDir, "kubelet")}
	for _, dir := range s.UpgradeKubeBinDirs {
		out = append(out, filepath.Join(dir, "kubelet"))
	}
	return out
}
