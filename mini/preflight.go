package mini

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// preflight refuses to start over a running cluster or on a machine that
// lacks what a local cluster needs.
func (u *up) preflight() error {
	if n := u.opts.ControlPlanes; n < 1 || n > MaxControlPlanes {
		return fmt.Errorf("--control-planes %d: a local cluster has 1 to %d control planes (3 tolerate one failure)", n, MaxControlPlanes)
	}
	if n := u.opts.Workers; n < 0 || n > MaxWorkers {
		return fmt.Errorf("--workers %d: a local cluster has 0 to %d workers", n, MaxWorkers)
	}
	if err := u.opts.Network.Valid(); err != nil {
		return err
	}
	if running, err := exists(u.opts.Dir); err != nil {
		return err
	} else if running {
		return fmt.Errorf("a local cluster already runs from %s; run `gatehouse mini down%s` first", u.opts.Dir, dirFlag(u.opts.Dir))
	}
	if err := networkFree(u.opts.Network); err != nil {
		return err
	}
	if err := CheckPrerequisites(); err != nil {
		return fmt.Errorf("this machine lacks what a local cluster needs:\n%w", err)
	}
	return checkBinaries(u.opts)
}

// checkProvider refuses a node provider that is unknown or lacks what it
// needs: a qemu node boots the node image in nodeImage.
func checkProvider(name, nodeImage string) error {
	switch name {
	case "", ProviderNetNS:
		return nil
	case ProviderQEMU:
		if nodeImage == "" {
			return errors.New("qemu nodes boot the node image, and none is given: build it with `make image` (or hack/node-image.sh, which prints its directory) and pass --node-image or set GATEHOUSE_NODE_IMAGE")
		}
		if _, err := os.Stat(nodeImage); err != nil {
			return fmt.Errorf("the node image: %w (build it with `make image` or hack/node-image.sh)", err)
		}
		_, err := newProvider(name, providerConfig{NodeImage: nodeImage})
		return err
	}
	_, err := newProvider(name, providerConfig{})
	return err
}

// checkBinaries names every binary a local cluster needs that is missing.
func checkBinaries(opts Options) error {
	if opts.KubeBinDir == "" {
		return errors.New("the pinned Kubernetes binaries are not found: pass --kube-bin or set GATEHOUSE_KUBE_BIN=$(hack/kube-binaries.sh) (make mini-up does)")
	}
	var errs []error
	for _, b := range []string{"gatehouse", "gatehouse-bootstrapper", "gatehouse-joinservice", "gatehouse-keyservice", "gatehouse-pause"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil {
			errs = append(errs, fmt.Errorf("%s missing in %s: run `make build`", b, opts.BinDir))
		}
	}
	for _, b := range []string{"kube", "kubeadm", "kube-proxy", "etcd"} {
		if _, err := os.Stat(filepath.Join(opts.KubeBinDir, b)); err != nil {
			errs = append(errs, fmt.Errorf("%s missing in %s: run hack/kube-binaries.sh (make setup does)", b, opts.KubeBinDir))
		}
	}
	if opts.AddonBinDir == "" {
		errs = append(errs, errors.New("CoreDNS and the registry are not found: pass --addon-bin or set GATEHOUSE_ADDON_BIN=$(hack/addon-binaries.sh) (make mini-up does)"))
	} else {
		for _, b := range []string{"coredns", "registry"} {
			if _, err := os.Stat(filepath.Join(opts.AddonBinDir, b)); err != nil {
				errs = append(errs, fmt.Errorf("%s missing in %s: run hack/addon-binaries.sh (make setup does)", b, opts.AddonBinDir))
			}
		}
	}
	return errors.Join(errs...)
}
