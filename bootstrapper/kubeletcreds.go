package bootstrapper

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// Kubelet credentials after an outage: kubelet client certificates live
// as long as the cluster's kubeletCertificateLifetime (24 h by default)
// and are renewed by the running kubelet. A node that was off for longer
// comes back with an expired one; the rejoin then asks the join service
// for a bootstrap token (attested, for the node's bound name) and the
// kubelet requests a new certificate with it; a control plane, which holds
// the cluster CA and may have to start before any join service does, signs
// a new one itself (docs/continuous-attestation.md).
const (
	// kubeletClientCurrent is the kubelet's client certificate and key
	// (its certificate store's current pair).
	kubeletClientCurrent = kubeadm.KubeletPKIDir + "/kubelet-client-current.pem"
	// bootstrapKubeconfig is the kubelet's --bootstrap-kubeconfig.
	bootstrapKubeconfig = "/etc/kubernetes/bootstrap-kubelet.conf"
	// kubeletRenewMargin: a client certificate expiring within this long
	// is renewed at rejoin; the kubelet could not renew it in time itself.
	kubeletRenewMargin = 2 * time.Minute
)

// signKubeletClient gives the kubelet of a control plane, which holds the
// cluster CA, a new client certificate signed with it, valid as long as
// the expired one was (or kubeadm.DefaultKubeletCertLifetime). It returns
// false, doing nothing, on a node without the CA key.
func (s *Machine) signKubeletClient(now time.Time) (bool, error) {
	if _, err := os.Stat(s.path(kubeadm.PKIDir + "/ca.key")); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	ca, err := clusterpki.LoadCA(s.path(kubeadm.PKIDir+"/ca.crt"), s.path(kubeadm.PKIDir+"/ca.key"))
	if err != nil {
		return false, err
	}
	lifetime := kubeadm.DefaultKubeletCertLifetime
	if data, err := os.ReadFile(s.path(kubeletClientCurrent)); err == nil {
		if block, _ := pem.Decode(data); block != nil {
			// Signers backdate NotBefore by the clock skew they allow.
			if old, err := x509.ParseCertificate(block.Bytes); err == nil && old.NotAfter.Sub(old.NotBefore) > 2*clusterpki.ClockSkew {
				lifetime = old.NotAfter.Sub(old.NotBefore) - clusterpki.ClockSkew
			}
		}
	}
	certPEM, keyPEM, err := ca.SignKubeletClient(s.Node.Name, now, lifetime)
	if err != nil {
		return false, err
	}
	return true, s.writeKubeletPair("kubelet-client", certPEM, keyPEM, now)
}

// kubeletClientExpiring reports whether the kubelet's client certificate
// is missing, unreadable or expires within kubeletRenewMargin of now.
func (s *Machine) kubeletClientExpiring(now time.Time) bool {
	pair, err := tls.LoadX509KeyPair(s.path(kubeletClientCurrent), s.path(kubeletClientCurrent))
	return err != nil || pair.Leaf == nil || pair.Leaf.NotAfter.Before(now.Add(kubeletRenewMargin))
}

// writeBootstrapKubeconfig writes the kubelet's bootstrap kubeconfig:
// the API server and CA of its kubelet.conf, with token. The kubelet,
// whose client certificate expired, requests a new one with it.
func (s *Machine) writeBootstrapKubeconfig(token string) error {
	current, err := clientcmd.LoadFromFile(s.path(kubeadm.KubeletKubeconfigPath))
	if err != nil {
		return fmt.Errorf("reading the kubelet's kubeconfig: %w", err)
	}
	ctx, ok := current.Contexts[current.CurrentContext]
	if !ok || current.Clusters[ctx.Cluster] == nil {
		return errors.New("the kubelet's kubeconfig has no current cluster")
	}
	const user = "tls-bootstrap-token-user"
	config := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{ctx.Cluster: current.Clusters[ctx.Cluster]},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {Token: token}},
		Contexts:       map[string]*clientcmdapi.Context{user + "@" + ctx.Cluster: {Cluster: ctx.Cluster, AuthInfo: user}},
		CurrentContext: user + "@" + ctx.Cluster,
	}
	data, err := clientcmd.Write(config)
	if err != nil {
		return fmt.Errorf("writing the kubelet's bootstrap kubeconfig: %w", err)
	}
	return s.writeFile(bootstrapKubeconfig, data, 0o600)
}
