package mini

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gatehouse-dev/gatehouse/internal/versions"
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
	if err := u.makeProviders(); err != nil {
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
	if err := checkBinaries(u.opts); err != nil {
		return err
	}
	return checkKubeVersions(u.opts)
}

// checkKubeVersions refuses a Kubernetes build that is not the cluster's
// version, and an upgrade build that is not newer, before anything is
// made.
func checkKubeVersions(opts Options) error {
	ctx := context.Background()
	got, err := kubeadmVersion(ctx, opts.KubeBinDir)
	if err != nil {
		return err
	}
	if got != opts.KubernetesVersion {
		return fmt.Errorf("the Kubernetes build in %s is %s, not %s: pass its directory with --kube-bin (hack/kube-binaries.sh MINOR builds it)", opts.KubeBinDir, got, opts.KubernetesVersion)
	}
	for _, dir := range opts.UpgradeKubeBinDirs {
		v, err := kubeadmVersion(ctx, dir)
		if err != nil {
			return err
		}
		release, err := versions.Resolve(v)
		if err != nil {
			return fmt.Errorf("--upgrade-kube-bin %s: %w", dir, err)
		}
		if v == opts.KubernetesVersion {
			return fmt.Errorf("--upgrade-kube-bin %s is the cluster's own version %s: name a later build", dir, v)
		}
		if err := versions.CheckUpgrade(opts.KubernetesVersion, release); err != nil {
			return fmt.Errorf("--upgrade-kube-bin %s: %w", dir, err)
		}
	}
	return nil
}

// makeProviders makes the providers the options choose, or refuses the
// choice: more VM workers than workers, an unknown provider, or qemu nodes
// without a node image.
func (u *up) makeProviders() error {
	if n := u.opts.VMWorkers; n < 0 || n > u.opts.Workers {
		return fmt.Errorf("--vm-workers %d: 0 to --workers (%d) of the workers can be VMs", n, u.opts.Workers)
	}
	u.providers = map[string]Provider{}
	for _, name := range u.opts.providerNames() {
		if err := checkProvider(name, u.opts.NodeImage); err != nil {
			return err
		}
		p, err := newProvider(name, providerConfig{Network: u.opts.Network, Gatehouse: filepath.Join(u.opts.BinDir, "gatehouse"), NodeImage: u.opts.NodeImage})
		if err != nil {
			return err
		}
		u.providers[name] = p
	}
	return nil
}

// checkProvider refuses a provider name that is unknown, and qemu without
// a node image (nodeImage, its directory) to boot.
func checkProvider(name, nodeImage string) error {
	switch name {
	case "", ProviderNetNS:
		return nil
	case ProviderQEMU:
		if nodeImage == "" {
			return errors.New("qemu nodes boot the node image, and none is given: build it with `make image` (hack/node-image.sh builds or finds it and prints its directory) and pass its directory with --node-image")
		}
		if _, err := os.Stat(nodeImage); err != nil {
			return fmt.Errorf("the node image qemu nodes boot: %w (build it with `make image`, or hack/node-image.sh, which prints its directory)", err)
		}
		return nil
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
