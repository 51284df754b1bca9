package testenv

import (
	"fmt"
	"os"
	"path/filepath"
)

// BinDirEnv names the environment variable pointing at the pinned Kubernetes
// binaries; `make test` sets it to the output of hack/kube-binaries.sh.
const BinDirEnv = "GATEHOUSE_KUBE_BIN"

// requiredBinaries must all be present in a binary directory.
var requiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubeadm", "kubectl"}

// BinDir returns the directory holding the pinned Kubernetes binaries: the
// value of GATEHOUSE_KUBE_BIN, else of KUBEBUILDER_ASSETS. It returns an error
// saying how to build them when neither is set or a binary is missing.
func BinDir() (string, error) {
	dir := os.Getenv(BinDirEnv)
	source := BinDirEnv
	if dir == "" {
		dir, source = os.Getenv("KUBEBUILDER_ASSETS"), "KUBEBUILDER_ASSETS"
	}
	if dir == "" {
		return "", fmt.Errorf("neither %s nor KUBEBUILDER_ASSETS is set: run the tests with `make test`, "+
			"or export %s=$(hack/kube-binaries.sh)", BinDirEnv, BinDirEnv)
	}
	for _, name := range requiredBinaries {
		path := filepath.Join(dir, name)
		if info, err := os.Stat(path); err != nil || info.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s has no executable %s: rebuild with hack/kube-binaries.sh", source, dir, name)
		}
	}
	return dir, nil
}

// AddonBinDirEnv names the directory of the local cluster's add-on
// binaries (CoreDNS, the registry) that hack/addon-binaries.sh builds.
const AddonBinDirEnv = "GATEHOUSE_ADDON_BIN"

// AddonBinDir returns the add-on binaries' directory, or an error naming
// how to get it.
func AddonBinDir() (string, error) {
	dir := os.Getenv(AddonBinDirEnv)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: run the tests with `make test`, or export %s=$(hack/addon-binaries.sh)", AddonBinDirEnv, AddonBinDirEnv)
	}
	for _, name := range []string{"coredns", "registry"} {
		if info, err := os.Stat(filepath.Join(dir, name)); err != nil || info.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s=%s has no executable %s: rebuild with hack/addon-binaries.sh", AddonBinDirEnv, dir, name)
		}
	}
	return dir, nil
}

// PreviousBinDirEnv names the environment variable pointing at the
// Kubernetes build of the minor version before the default
// (hack/kube-binaries.sh 1.35), which the upgrade test starts its cluster
// at; `make test` sets it.
const PreviousBinDirEnv = "GATEHOUSE_KUBE_BIN_PREVIOUS"

// PreviousBinDir returns $GATEHOUSE_KUBE_BIN_PREVIOUS, or an error saying
// how to build it.
func PreviousBinDir() (string, error) {
	dir := os.Getenv(PreviousBinDirEnv)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: run the tests with `make test`, or export %s=$(hack/kube-binaries.sh 1.35)", PreviousBinDirEnv, PreviousBinDirEnv)
	}
	if _, err := os.Stat(filepath.Join(dir, "kubeadm")); err != nil {
		return "", fmt.Errorf("%s=%s has no kubeadm: %w", PreviousBinDirEnv, dir, err)
	}
	return dir, nil
}
