// Package clusterpki is what Gatehouse does with the cluster CA: it generates
// it on the first control plane with a named admin's certificate, and it
// checks kubelet certificate requests and signs kubelet certificates, and it
// issues and verifies the join service's own identity, which joiners trust
// through the cluster CA pin they were provisioned with.
package clusterpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// identityURI is the URI subject alternative name of the join service's
// certificate. Joiners accept a certificate chained to the pinned cluster CA
// only if it carries this name: the Kubernetes signers never put URI names
// into node certificates (kubernetes.io/kubelet-serving permits DNS and IP
// names only, Kubernetes docs "Certificate Signing Requests"), and this
// service refuses kubelet CSRs with any URI, so no node certificate can
// impersonate the join service.
const identityURI = "urn:gatehouse:joinservice"

// Certificate lifetimes.
const (
	// kubeletCertValidity is how long a kubelet certificate is valid when
	// SignKubelet is given no lifetime: a year, as kubeadm's. Clusters set
	// a shorter one (kubeadm.DefaultKubeletCertLifetime).
	kubeletCertValidity = 365 * 24 * time.Hour
	// identityValidity is how long the service's own certificate is valid;
	// it is renewed at half its life.
	identityValidity = 7 * 24 * time.Hour
	// ClockSkew backdates certificates so peers with slow clocks accept them
	// (the controller manager's signer backdates as much).
	ClockSkew = 5 * time.Minute
)

// CA is the cluster CA (kubeadm's /etc/kubernetes/pki/ca.crt and ca.key). It
// signs kubelet certificates and the join service's own identity.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// LoadCA reads a PEM CA certificate and its PEM private key (PKCS#8, PKCS#1
// or SEC 1), checking that they belong together and that the certificate is
// a CA.
func LoadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("reading CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("reading CA key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading CA %s and %s: %w", certPath, keyPath, err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key %s cannot sign", keyPath)
	}
	return newCA(pair.Leaf, signer)
}

// newCA returns a CA for cert and its key.
func newCA(cert *x509.Certificate, key crypto.Signer) (*CA, error) {
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("CA certificate is not a CA with the certSign key usage")
	}
	return &CA{cert: cert, key: key}, nil
}

// Certificate returns the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// DiscoveryTokenCACertHash returns kubeadm's pin of the CA.
func (ca *CA) DiscoveryTokenCACertHash() string { return kubeadm.DiscoveryTokenCACertHash(ca.cert) }

func (ca *CA) sign(tmpl *x509.Certificate, pub crypto.PublicKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate: %w", err)
	}
	return der, nil
}

// KubeletRequest is a checked kubelet certificate request.
type KubeletRequest struct {
	csr *x509.CertificateRequest
	// NodeName is the node the certificate is for (CN system:node:<NodeName>).
	NodeName string
}

// ParseKubeletCSR parses and checks a DER PKCS#10 request (RFC 2986) for a
// kubelet certificate, the way the kubernetes.io/kubelet-serving signer
// constrains one (Kubernetes docs, "Certificate Signing Requests"):
//
//   - the signature verifies under the request's public key, which is ECDSA
//     P-256/P-384, Ed25519 or RSA of at least 2048 bits;
//   - the subject is exactly O=system:nodes, CN=system:node:<name> with
//     <name> a DNS-1123 subdomain;
//   - there is at least one DNS or IP subject alternative name, DNS names
//     are DNS-1123 subdomains, IPs are unicast and not loopback or
//     unspecified, and there are no URI or e-mail names.
//
// Errors name the field that is wrong.
func ParseKubeletCSR(der []byte) (*KubeletRequest, error) {
	if len(der) == 0 {
		return nil, errors.New("certificate request is empty; send a DER PKCS#10 request for CN=system:node:<name>, O=system:nodes")
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("certificate request does not parse as DER PKCS#10: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request signature does not verify: %w", err)
	}
	if err := checkPublicKey(csr.PublicKey); err != nil {
		return nil, err
	}
	name, err := kubeletNodeName(csr.Subject)
	if err != nil {
		return nil, err
	}
	if len(csr.URIs) > 0 || len(csr.EmailAddresses) > 0 {
		return nil, errors.New("certificate request has URI or e-mail names; a kubelet certificate carries DNS and IP names only")
	}
	if len(csr.DNSNames)+len(csr.IPAddresses) == 0 {
		return nil, errors.New("certificate request has no DNS or IP subject alternative names; add the node's host name and addresses")
	}
	for _, d := range csr.DNSNames {
		if errs := validation.IsDNS1123Subdomain(d); len(errs) > 0 {
			return nil, fmt.Errorf("certificate request DNS name %q is invalid: %s", d, strings.Join(errs, "; "))
		}
	}
	for _, ip := range csr.IPAddresses {
		if ip.IsLoopback() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast() {
			return nil, fmt.Errorf("certificate request IP address %s is loopback, unspecified, multicast or link-local; use the node's address", ip)
		}
	}
	return &KubeletRequest{csr: csr, NodeName: name}, nil
}

// ParseKubeletClientCSR parses and checks a DER PKCS#10 request for a
// kubelet client certificate, the way the
// kubernetes.io/kube-apiserver-client-kubelet signer constrains one
// (Kubernetes docs, "Certificate Signing Requests"): its signature
// verifies under a key ParseKubeletCSR accepts, the subject is exactly
// O=system:nodes, CN=system:node:<name>, and it has no subject alternative
// names. It returns the node name; errors name the field that is wrong.
func ParseKubeletClientCSR(der []byte) (string, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return "", fmt.Errorf("certificate request does not parse as DER PKCS#10: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return "", fmt.Errorf("certificate request signature does not verify: %w", err)
	}
	if err := checkPublicKey(csr.PublicKey); err != nil {
		return "", err
	}
	if len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.URIs)+len(csr.EmailAddresses) > 0 {
		return "", errors.New("certificate request has subject alternative names; a kubelet client certificate carries none")
	}
	return kubeletNodeName(csr.Subject)
}

func checkPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return errors.New("certificate request key is ECDSA on a curve other than P-256 or P-384")
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("certificate request key is RSA with %d bits; at least 2048 are required", k.N.BitLen())
		}
	case ed25519.PublicKey:
	default:
		return fmt.Errorf("certificate request key type %T is not ECDSA, Ed25519 or RSA", pub)
	}
	return nil
}

func kubeletNodeName(subject pkix.Name) (string, error) {
	const prefix = "system:node:"
	if len(subject.Organization) != 1 || subject.Organization[0] != "system:nodes" {
		return "", fmt.Errorf("certificate request organization is %q; it must be exactly [\"system:nodes\"]", subject.Organization)
	}
	if len(subject.OrganizationalUnit)+len(subject.Country)+len(subject.Province)+len(subject.Locality)+
		len(subject.StreetAddress)+len(subject.PostalCode) > 0 || subject.SerialNumber != "" {
		return "", errors.New("certificate request subject has fields besides CN and O")
	}
	name, ok := strings.CutPrefix(subject.CommonName, prefix)
	if !ok {
		return "", fmt.Errorf("certificate request common name %q does not start with %q", subject.CommonName, prefix)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("certificate request node name %q is invalid: %s", name, strings.Join(errs, "; "))
	}
	return name, nil
}

// SignKubelet issues a kubelet client and serving certificate (DER) for a
// checked request, valid for lifetime from now (kubeletCertValidity when
// zero).
func (ca *CA) SignKubelet(req *KubeletRequest, now time.Time, lifetime time.Duration) ([]byte, error) {
	if lifetime <= 0 {
		lifetime = kubeletCertValidity
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:node:" + req.NodeName, Organization: []string{"system:nodes"}},
		DNSNames:    req.csr.DNSNames,
		IPAddresses: req.csr.IPAddresses,
		NotBefore:   now.Add(-ClockSkew),
		NotAfter:    now.Add(lifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	if _, ok := req.csr.PublicKey.(*rsa.PublicKey); ok {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	der, err := ca.sign(tmpl, req.csr.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("signing kubelet certificate: %w", err)
	}
	return der, nil
}

// Identity is a certificate of the join service's own, signed by the
// cluster CA and renewed at half its life: its TLS server identity
// (NewIdentity) or its client certificate for nodes' evidence endpoints
// (NewVerifierIdentity). It is safe for concurrent use.
type Identity struct {
	ca       *CA
	now      func() time.Time
	validity time.Duration
	template func() (*x509.Certificate, error)

	mu      sync.Mutex
	cert    *tls.Certificate
	renewAt time.Time
}

// NewIdentity returns the service identity signed by ca: CN
// gatehouse-joinservice with the URI name identityURI, for server
// authentication, valid 7 days; now is the clock (time.Now in production).
func NewIdentity(ca *CA, now func() time.Time) *Identity {
	return &Identity{ca: ca, now: now, validity: identityValidity, template: func() (*x509.Certificate, error) {
		uri, err := url.Parse(identityURI)
		if err != nil {
			return nil, err
		}
		return &x509.Certificate{
			Subject:     pkix.Name{CommonName: "gatehouse-joinservice"},
			URIs:        []*url.URL{uri},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}, nil
	}}
}

// verifierGroup is the subject organization of the client certificate the
// join service presents to nodes' evidence endpoints, which answer it
// (docs/continuous-attestation.md, "The evidence endpoint's door"). The
// API server would read it as a group that no RBAC binding names; only
// the cluster CA's holders (control planes, the join service) and
// administrators approving a kube-apiserver-client CSR can issue it.
const verifierGroup = "gatehouse:verifiers"

// verifierValidity is how long the join service's evidence client
// certificate is valid; it is renewed at half its life, so a certificate
// that leaked stops working within an hour.
const verifierValidity = time.Hour

// NewVerifierIdentity returns the join service's client certificate for
// nodes' evidence endpoints, signed by ca: CN gatehouse-joinservice,
// O=verifierGroup, client authentication only, valid verifierValidity
// (backdated ClockSkew) and renewed at half of it; now is the clock.
func NewVerifierIdentity(ca *CA, now func() time.Time) *Identity {
	return &Identity{ca: ca, now: now, validity: verifierValidity, template: func() (*x509.Certificate, error) {
		return &x509.Certificate{
			Subject:     pkix.Name{CommonName: "gatehouse-joinservice", Organization: []string{verifierGroup}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, nil
	}}
}

// Certificate returns the current certificate chain (leaf, CA), issuing a new
// one with a fresh key when none exists or half its life has passed.
func (id *Identity) Certificate() (*tls.Certificate, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	now := id.now()
	if id.cert != nil && now.Before(id.renewAt) {
		return id.cert, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating join service key: %w", err)
	}
	tmpl, err := id.template()
	if err != nil {
		return nil, err
	}
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-ClockSkew), now.Add(id.validity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := id.ca.sign(tmpl, key.Public())
	if err != nil {
		return nil, fmt.Errorf("issuing join service certificate %s: %w", tmpl.Subject, err)
	}
	id.cert = &tls.Certificate{Certificate: [][]byte{der, id.ca.cert.Raw}, PrivateKey: key}
	id.renewAt = now.Add(id.validity / 2)
	return id.cert, nil
}

// VerifyClusterIdentity returns a check of the join service's certificate
// chain for a joiner provisioned with the cluster's discovery token CA cert
// hash (kubeadm's "sha256:<hex>" pin, see internal/kubeadm): some
// certificate in the chain must be a CA whose public key has that hash, the
// leaf must chain to it for server authentication at now(), and the leaf
// must carry identityURI. It is atls.Config.VerifyPeer for joiners.
func VerifyClusterIdentity(caCertHash string, now func() time.Time) (func([]*x509.Certificate) error, error) {
	if !strings.HasPrefix(caCertHash, "sha256:") || len(caCertHash) != len("sha256:")+64 {
		return nil, fmt.Errorf("cluster identity %q is not a discovery token CA cert hash \"sha256:<64 hex digits>\"", caCertHash)
	}
	return func(chain []*x509.Certificate) error {
		if len(chain) < 2 {
			return errors.New("join service sent no CA certificate with its certificate")
		}
		roots := x509.NewCertPool()
		for _, c := range chain[1:] {
			if c.IsCA && subtle.ConstantTimeCompare([]byte(kubeadm.DiscoveryTokenCACertHash(c)), []byte(caCertHash)) == 1 {
				roots.AddCert(c)
			}
		}
		leaf := chain[0]
		if _, err := leaf.Verify(x509.VerifyOptions{
			Roots:       roots,
			CurrentTime: now(),
			KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}); err != nil {
			return fmt.Errorf("join service certificate does not chain to the pinned cluster CA %s: %w", caCertHash, err)
		}
		for _, u := range leaf.URIs {
			if u.String() == identityURI {
				return nil
			}
		}
		return fmt.Errorf("certificate chained to the cluster CA lacks the join service name %s", identityURI)
	}, nil
}

// errNameNotOwned means a kubelet certificate request names something the
// node does not own: another node, an address not its own, or a name of
// the API server.
var errNameNotOwned = errors.New("certificate request names something the node does not own")

// NodeNames are the names and addresses a node owns, the only ones its
// kubelet certificate may carry (as kubelet-csr-approver and the
// NodeRestriction admission plugin reason: a node speaks only for itself).
type NodeNames struct {
	// Addresses are the node's own addresses, e.g. its connection's source.
	Addresses []netip.Addr
	// CIDRs are configured ranges of node addresses a node may also name.
	CIDRs []netip.Prefix
	// DNSSuffixes make <node name>.<suffix> the node's too.
	DNSSuffixes []string
	// Reserved are further names and addresses no node may carry, such as
	// the API server endpoint's host.
	Reserved []string
}

// apiServerNames are the names the API server's certificate carries inside
// the cluster (kubeadm's apiserver certificate); a kubelet certificate with
// one of them could impersonate the API server to Pods.
var apiServerNames = []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"}

func reservedName(name string, reserved []string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if slices.Contains(apiServerNames, name) || strings.HasPrefix(name, "kubernetes.default.svc.") {
		return true
	}
	return slices.ContainsFunc(reserved, func(r string) bool { return strings.EqualFold(r, name) })
}

// CheckNames checks that every name of r belongs to the node: the node name
// is not a name of the API server; DNS names are the node name or the node
// name under one of o.DNSSuffixes; IP addresses are in o.Addresses or
// o.CIDRs; nothing is in o.Reserved. Errors wrap errNameNotOwned and name
// the first offending value.
func (r *KubeletRequest) CheckNames(o NodeNames) error {
	if reservedName(r.NodeName, o.Reserved) {
		return fmt.Errorf("%w: node name %q is a name of the API server", errNameNotOwned, r.NodeName)
	}
	for _, d := range r.csr.DNSNames {
		own := strings.EqualFold(d, r.NodeName) || slices.ContainsFunc(o.DNSSuffixes, func(s string) bool {
			return strings.EqualFold(d, r.NodeName+"."+s)
		})
		if !own || reservedName(d, o.Reserved) {
			return fmt.Errorf("%w: DNS name %q is neither the node name %q nor the node name under a configured DNS suffix", errNameNotOwned, d, r.NodeName)
		}
	}
	for _, ip := range r.csr.IPAddresses {
		addr, _ := netip.AddrFromSlice(ip)
		addr = addr.Unmap()
		own := slices.Contains(o.Addresses, addr) || slices.ContainsFunc(o.CIDRs, func(p netip.Prefix) bool { return p.Contains(addr) })
		if !own || reservedName(addr.String(), o.Reserved) {
			return fmt.Errorf("%w: IP address %s is neither the address the node connected from nor in a configured node CIDR", errNameNotOwned, addr)
		}
	}
	return nil
}
