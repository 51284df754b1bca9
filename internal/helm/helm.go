// Package helm connects the Helm SDK to a cluster: the one action
// configuration the CLI's upgrade and the local cluster install and upgrade
// Gatehouse's charts with (docs/upgrades.md).
package helm

import (
	"fmt"

	"helm.sh/helm/v3/pkg/action"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// Config returns Helm's action configuration for releases in namespace of
// the cluster the kubeconfig file names, with release records in Secrets
// (Helm's default storage driver). It fails when the kubeconfig cannot be
// loaded.
func Config(kubeconfig, namespace string) (*action.Configuration, error) {
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kubeconfig, &namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", func(string, ...any) {}); err != nil {
		return nil, fmt.Errorf("connecting Helm to the cluster: %w", err)
	}
	return cfg, nil
}
