package testenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certValidity is how long the test PKI's certificates are valid. Test
// environments live minutes; a day leaves room for clock skew and debugging.
const certValidity = 24 * time.Hour

// pki is the freshly generated public key infrastructure of one environment:
// a cluster CA and the certificates and keys signed by it, written as PEM
// files into dir with the names kubeadm uses under /etc/kubernetes/pki.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  crypto.Signer
	caPEM  []byte
	serial int64
}

// newPKI generates a self-signed ECDSA P-256 cluster CA and writes ca.crt and
// ca.key into dir.
func newPKI(dir string) (*pki, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gatehouse-testenv-ca"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-signing CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	p := &pki{dir: dir, ca: ca, caKey: key, caPEM: encodeCert(der), serial: 1}
	if err := p.write("ca", der, key); err != nil {
		return nil, err
	}
	return p, nil
}

// certSpec describes one leaf certificate.
type certSpec struct {
	name   string // file base name: <name>.crt, <name>.key
	cn     string
	orgs   []string
	dns    []string
	ips    []net.IP
	usages []x509.ExtKeyUsage
}

// issue generates a key pair, signs a certificate for spec with the CA and
// writes <name>.crt and <name>.key. It returns the certificate and key PEM.
func (p *pki) issue(spec certSpec) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating key for %s: %w", spec.name, err)
	}
	p.serial++
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: spec.cn, Organization: spec.orgs},
		DNSNames:     spec.dns,
		IPAddresses:  spec.ips,
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  spec.usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, key.Public(), p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing certificate %s: %w", spec.name, err)
	}
	if err := p.write(spec.name, der, key); err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding key %s: %w", spec.name, err)
	}
	return encodeCert(der), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// writeServiceAccountKeys writes the service-account token signing key pair
// sa.key and sa.pub.
func (p *pki) writeServiceAccountKeys() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating service account key: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding service account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("encoding service account public key: %w", err)
	}
	if err := writeFile(p.path("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		return err
	}
	return writeFile(p.path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))
}

func (p *pki) write(name string, certDER []byte, key crypto.Signer) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding key %s: %w", name, err)
	}
	if err := writeFile(p.path(name+".crt"), encodeCert(certDER)); err != nil {
		return err
	}
	return writeFile(p.path(name+".key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func writeFile(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

var (
	serverUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	clientUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
)
