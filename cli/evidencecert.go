package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
)

// evidenceFetcher returns how `verify --node` fetches evidence: with the
// client certificate of the admin kubeconfig at path, which a node that
// belongs to a cluster requires (docs/continuous-attestation.md, "The
// evidence endpoint's door"). A kubeconfig named on the command line
// (explicit) must hold one; the default one is used only when it exists
// and holds one, so a node not yet in a cluster is verified without it.
func evidenceFetcher(path string, explicit bool) (atls.EvidenceFetcher, error) {
	if path == "" {
		return atls.EvidenceFetcher{}, nil
	}
	if !explicit {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return atls.EvidenceFetcher{}, nil // no default kubeconfig: an anonymous caller
		}
	}
	cert, err := kubeconfigCertificate(path)
	switch {
	case err != nil && explicit:
		return atls.EvidenceFetcher{}, err
	case err != nil:
		// The default file without a certificate: anonymous; a node that
		// refuses says to pass --kubeconfig.
		return atls.EvidenceFetcher{}, nil
	}
	return atls.EvidenceFetcher{Certificate: func() (*tls.Certificate, error) { return cert, nil }}, nil
}

// kubeconfigCertificate returns the client certificate and key of the
// kubeconfig's current context (inline data or files).
func kubeconfigCertificate(path string) (*tls.Certificate, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig %s: %w", path, err)
	}
	certPEM, keyPEM := cfg.CertData, cfg.KeyData
	if len(certPEM) == 0 && cfg.CertFile != "" {
		if certPEM, err = os.ReadFile(cfg.CertFile); err != nil {
			return nil, fmt.Errorf("the kubeconfig %s: reading its client certificate: %w", path, err)
		}
	}
	if len(keyPEM) == 0 && cfg.KeyFile != "" {
		if keyPEM, err = os.ReadFile(cfg.KeyFile); err != nil {
			return nil, fmt.Errorf("the kubeconfig %s: reading its client key: %w", path, err)
		}
	}
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, fmt.Errorf("the kubeconfig %s has no client certificate and key: a node's evidence endpoint answers "+
			"an administrator's client certificate of the cluster CA (the admin kubeconfig `gatehouse init` wrote, or kubeadm's admin.conf), "+
			"not a token", path)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig %s: its client certificate and key: %w", path, err)
	}
	return &pair, nil
}

// fetchError explains a failed fetch; a refusal at the node's door says
// what to present.
func fetchError(node, kubeconfig string, f atls.EvidenceFetcher, err error) error {
	if !errors.Is(err, atls.ErrRefused) {
		return fmt.Errorf("node %s does not verify: %w", node, err)
	}
	if f.Certificate == nil {
		return fmt.Errorf("node %s refused this anonymous caller: it belongs to a cluster and answers only the cluster's join service "+
			"and administrators; pass --kubeconfig with the cluster's admin kubeconfig (%w)", node, err)
	}
	return fmt.Errorf("node %s refused the client certificate of %s: present an admin kubeconfig of the node's cluster (%w)", node, kubeconfig, err)
}
