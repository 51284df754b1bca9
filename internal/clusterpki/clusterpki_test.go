package clusterpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

func csr(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func ecKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func kubeletTemplate() *x509.CertificateRequest {
	return &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}},
		DNSNames:    []string{"worker-1"},
		IPAddresses: []net.IP{net.IPv4(10, 0, 0, 11)},
	}
}

func TestParseKubeletCSR(t *testing.T) {
	key := ecKey(t)
	smallRSA, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	tampered := csr(t, key, kubeletTemplate())
	tampered[len(tampered)-5] ^= 0xff
	with := func(f func(*x509.CertificateRequest)) []byte {
		tmpl := kubeletTemplate()
		f(tmpl)
		return csr(t, key, tmpl)
	}
	tests := []struct {
		name    string
		der     []byte
		wantErr string
	}{
		{name: "valid", der: csr(t, key, kubeletTemplate())},
		{name: "empty", der: nil, wantErr: "certificate request is empty"},
		{name: "garbage", der: []byte("not a csr"), wantErr: "does not parse as DER PKCS#10"},
		{name: "bad signature", der: tampered, wantErr: "signature does not verify"},
		{name: "small RSA key", der: csr(t, smallRSA, kubeletTemplate()), wantErr: "RSA with 1024 bits"},
		{name: "wrong organization", der: with(func(r *x509.CertificateRequest) { r.Subject.Organization = []string{"system:masters"} }), wantErr: "organization"},
		{name: "two organizations", der: with(func(r *x509.CertificateRequest) {
			r.Subject.Organization = []string{"system:nodes", "system:masters"}
		}), wantErr: "organization"},
		{name: "not a node name", der: with(func(r *x509.CertificateRequest) { r.Subject.CommonName = "admin" }), wantErr: "does not start with \"system:node:\""},
		{name: "invalid node name", der: with(func(r *x509.CertificateRequest) { r.Subject.CommonName = "system:node:Worker_1" }), wantErr: "node name \"Worker_1\" is invalid"},
		{name: "extra subject field", der: with(func(r *x509.CertificateRequest) { r.Subject.OrganizationalUnit = []string{"x"} }), wantErr: "fields besides CN and O"},
		{name: "no SANs", der: with(func(r *x509.CertificateRequest) { r.DNSNames, r.IPAddresses = nil, nil }), wantErr: "no DNS or IP"},
		{name: "URI SAN", der: with(func(r *x509.CertificateRequest) {
			r.URIs = []*url.URL{{Scheme: "urn", Opaque: "gatehouse:joinservice"}}
		}), wantErr: "URI or e-mail"},
		{name: "bad DNS SAN", der: with(func(r *x509.CertificateRequest) { r.DNSNames = []string{"-bad-"} }), wantErr: "DNS name \"-bad-\" is invalid"},
		{name: "loopback IP", der: with(func(r *x509.CertificateRequest) { r.IPAddresses = []net.IP{net.IPv6loopback} }), wantErr: "loopback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := ParseKubeletCSR(tt.der)
			if tt.wantErr == "" {
				if err != nil || req.NodeName != "worker-1" {
					t.Fatalf("ParseKubeletCSR = %+v, %v", req, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseKubeletClientCSR(t *testing.T) {
	key := ecKey(t)
	client := func(f func(*x509.CertificateRequest)) []byte {
		tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}}}
		f(tmpl)
		return csr(t, key, tmpl)
	}
	tampered := client(func(*x509.CertificateRequest) {})
	tampered[len(tampered)-5] ^= 0xff
	for _, tt := range []struct {
		name    string
		der     []byte
		wantErr string
	}{
		{"valid", client(func(*x509.CertificateRequest) {}), ""},
		{"garbage", []byte("not a csr"), "does not parse as DER PKCS#10"},
		{"bad signature", tampered, "signature does not verify"},
		{"with a SAN", client(func(r *x509.CertificateRequest) { r.DNSNames = []string{"worker-1"} }), "carries none"},
		{"another group", client(func(r *x509.CertificateRequest) { r.Subject.Organization = []string{"system:masters"} }), "organization"},
		{"not a node", client(func(r *x509.CertificateRequest) { r.Subject.CommonName = "admin" }), "does not start with \"system:node:\""},
	} {
		node, err := ParseKubeletClientCSR(tt.der)
		if tt.wantErr == "" {
			if err != nil || node != "worker-1" {
				t.Errorf("%s: ParseKubeletClientCSR = %q, %v", tt.name, node, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: error = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}

// FuzzParseKubeletClientCSR feeds arbitrary bytes to the parser of kubelet
// client CSRs, which any node's credentials can create.
func FuzzParseKubeletClientCSR(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(csr(f, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:w", Organization: []string{"system:nodes"}}}))
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, der []byte) {
		node, err := ParseKubeletClientCSR(der)
		if err == nil && node == "" {
			t.Fatal("accepted a request without a node name")
		}
	})
}

func newTestCA(t testing.TB) *CA {
	t.Helper()
	tc := testkit.NewCA(t, "kubernetes")
	ca, err := newCA(tc.Cert, tc.Key)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestSignKubelet(t *testing.T) {
	ca := newTestCA(t)
	req, err := ParseKubeletCSR(csr(t, ecKey(t), kubeletTemplate()))
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignKubelet(req, time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("usage %v: %v", u, err)
		}
	}
	if cert.Subject.CommonName != "system:node:worker-1" || len(cert.URIs) != 0 || cert.DNSNames[0] != "worker-1" {
		t.Errorf("certificate %s %v %v", cert.Subject, cert.DNSNames, cert.URIs)
	}
	// The CA's own lifetime caps the certificate's (the test CA lives an hour).
	if !cert.NotAfter.Equal(ca.Certificate().NotAfter) {
		t.Errorf("NotAfter %s, want the CA's %s", cert.NotAfter, ca.Certificate().NotAfter)
	}
}

func TestClusterIdentity(t *testing.T) {
	ca := newTestCA(t)
	now := time.Now()
	clock := func() time.Time { return now }
	id := NewIdentity(ca, clock)
	cert, err := id.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := id.Certificate(); again != cert {
		t.Error("identity reissued before half its life")
	}
	verify, err := VerifyClusterIdentity(ca.DiscoveryTokenCACertHash(), clock)
	if err != nil {
		t.Fatal(err)
	}
	parse := func(c *tls.Certificate) []*x509.Certificate {
		var chain []*x509.Certificate
		for _, der := range c.Certificate {
			x, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			chain = append(chain, x)
		}
		return chain
	}
	if err := verify(parse(cert)); err != nil {
		t.Fatalf("the service's own identity: %v", err)
	}

	// A kubelet serving certificate from the same CA is not the join service.
	req, err := ParseKubeletCSR(csr(t, ecKey(t), kubeletTemplate()))
	if err != nil {
		t.Fatal(err)
	}
	kubeletDER, err := ca.SignKubelet(req, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	kubelet := &tls.Certificate{Certificate: [][]byte{kubeletDER, ca.Certificate().Raw}}
	other := NewIdentity(newTestCA(t), clock)
	otherCert, err := other.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	leafOnly := &tls.Certificate{Certificate: cert.Certificate[:1]}
	for name, tt := range map[string]struct {
		chain   *tls.Certificate
		wantErr string
	}{
		"kubelet certificate": {kubelet, "lacks the join service name"},
		"another cluster":     {otherCert, "does not chain to the pinned cluster CA"},
		"no CA in the chain":  {leafOnly, "sent no CA certificate"},
	} {
		if err := verify(parse(tt.chain)); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: %v, want %q", name, err, tt.wantErr)
		}
	}
	later := func() time.Time { return now.Add(4 * 24 * time.Hour) }
	if err := mustVerify(t, ca, later)(parse(cert)); err == nil {
		// The test CA expires after an hour, so its leaf does too.
		t.Error("an expired identity verified")
	}
	if _, err := VerifyClusterIdentity("sha256:abc", clock); err == nil {
		t.Error("a malformed pin was accepted")
	}
	if kubeadm.DiscoveryTokenCACertHash(ca.Certificate()) != ca.DiscoveryTokenCACertHash() {
		t.Error("CA hash differs from kubeadm's")
	}
}

func mustVerify(t *testing.T, ca *CA, now func() time.Time) func([]*x509.Certificate) error {
	t.Helper()
	v, err := VerifyClusterIdentity(ca.DiscoveryTokenCACertHash(), now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// FuzzParseKubeletCSR feeds arbitrary bytes to the parser of the CSR field
// of IssueJoinTicket, which attested but possibly malicious nodes control.
func FuzzParseKubeletCSR(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(csr(f, key, kubeletTemplate()))
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, der []byte) {
		req, err := ParseKubeletCSR(der)
		if err == nil && (req.NodeName == "" || len(req.csr.URIs) > 0) {
			t.Fatalf("accepted a request with node name %q and URIs %v", req.NodeName, req.csr.URIs)
		}
	})
}
