package clusterpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Lifetimes of what the first control plane generates, as kubeadm's
// (kubeadm docs, "Certificate Management with kubeadm").
const (
	// caValidity is the cluster CA's lifetime: ten years.
	caValidity = 10 * 365 * 24 * time.Hour
	// adminCertValidity is an admin client certificate's lifetime: a year.
	adminCertValidity = 365 * 24 * time.Hour
)

// AdminGroup is the group kubeadm binds to cluster-admin
// (ClusterRoleBinding kubeadm:cluster-admins), unlike system:masters, which
// bypasses authorization and cannot be revoked.
const AdminGroup = "kubeadm:cluster-admins"

// GenerateCA returns a new cluster CA (ECDSA P-256, CN=kubernetes, valid
// caValidity from now) with its certificate and PKCS#8 key in PEM, to be
// written as kubeadm's ca.crt and ca.key before `kubeadm init`, which then
// uses it instead of generating its own.
func GenerateCA(now time.Time) (ca *CA, certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generating CA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generating serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kubernetes"},
		NotBefore:             now.Add(-ClockSkew),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("self-signing CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return &CA{cert: cert, key: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// SignAdmin issues a client certificate (PEM) and its new key (PEM) for the
// named cluster administrator: CN=name, O=AdminGroup, valid
// adminCertValidity from now.
func (ca *CA) SignAdmin(name string, now time.Time) (certPEM, keyPEM []byte, err error) {
	if name == "" || name == "kubernetes-super-admin" {
		return nil, nil, fmt.Errorf("admin name %q: choose a named administrator, not the super-admin", name)
	}
	return ca.SignClient(name, []string{AdminGroup}, now)
}

// SignClient issues a Kubernetes client certificate (PEM) and its new key
// (PEM): user CN=name in groups O=groups, valid adminCertValidity from now.
// groups must not contain system:masters.
func (ca *CA) SignClient(name string, groups []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	return ca.signClient(name, groups, now, adminCertValidity)
}

// SignKubeletClient issues the kubelet client certificate (PEM) of node and
// its new key (PEM), as the kubernetes.io/kube-apiserver-client-kubelet
// signer would: CN=system:node:<node>, O=system:nodes, valid lifetime from
// now. The first control plane's kubelet starts with it; later ones renew
// through CSRs.
func (ca *CA) SignKubeletClient(node string, now time.Time, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	return ca.signClient("system:node:"+node, []string{"system:nodes"}, now, lifetime)
}

func (ca *CA) signClient(name string, groups []string, now time.Time, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	for _, g := range groups {
		if g == "system:masters" {
			return nil, nil, errors.New("refusing to issue a system:masters certificate: it bypasses authorization")
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating client key: %w", err)
	}
	der, err := ca.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: groups},
		NotBefore:   now.Add(-ClockSkew),
		NotAfter:    now.Add(lifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, key.Public())
	if err != nil {
		return nil, nil, fmt.Errorf("signing client certificate for %s: %w", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// NewKubeletCSR returns a new ECDSA P-256 key (PKCS#8 PEM) and a DER
// certificate request for the kubelet of node: CN=system:node:<node>,
// O=system:nodes, with the node name and ips as subject alternative names,
// which ParseKubeletCSR accepts.
func NewKubeletCSR(node string, ips []net.IP) (csrDER, keyPEM []byte, err error) {
	if len(ips) == 0 {
		return nil, nil, errors.New("kubelet certificate request needs at least one node IP")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating kubelet key: %w", err)
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:    []string{node},
		IPAddresses: ips,
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating kubelet certificate request: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return csrDER, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}
