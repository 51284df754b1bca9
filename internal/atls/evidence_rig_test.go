package atls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// countingAttester counts the quotes asked of the node's attester; a
// gate, when set, holds every quote until it is closed (a TPM stuck in
// a slow command), ignoring the caller's context as a TPM would.
type countingAttester struct {
	attestation.Attester
	calls   atomic.Int64
	gate    chan struct{}
	entered chan struct{} // receives once per quote held at the gate
}

func (c *countingAttester) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	c.calls.Add(1)
	if c.gate != nil {
		c.entered <- struct{}{}
		<-c.gate
	}
	return c.Attester.Attest(ctx, userData, nonce)
}

// endpoint is an EvidenceEndpoint serving on loopback.
type endpoint struct {
	addr     string
	reg      *prometheus.Registry
	attester *countingAttester
}

// serveEndpoint serves e with pair's attester (counted) on 127.0.0.1
// until the test ends; gate, when non-nil, holds quotes.
func serveEndpoint(t *testing.T, pair *tpmPair, e EvidenceEndpoint, gate chan struct{}) *endpoint {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &countingAttester{Attester: pair.attester, gate: gate, entered: make(chan struct{}, 16)}
	reg := prometheus.NewRegistry()
	e.Attester, e.Registerer = a, reg
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("the evidence endpoint ended with %v, want context.Canceled", err)
		}
	})
	return &endpoint{addr: lis.Addr().String(), reg: reg, attester: a}
}

// metric returns the value of the counter or gauge name whose labels
// include the given name/value pairs; 0 when there is none.
func (ep *endpoint) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	families, err := ep.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue next
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// waitMetric polls until metric equals want, failing after 30 s.
func (ep *endpoint) waitMetric(t *testing.T, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for ep.metric(t, name, labels...) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %g, want %g", name, labels, ep.metric(t, name, labels...), want)
		}
		time.Sleep(5 * time.Millisecond) // polling, bounded by the deadline above
	}
}

// fetcher is an EvidenceFetcher dialing from source (a 127/8 address:
// Linux routes all of it to loopback, so each is a distinct source).
func fetcher(source string, cert func() (*tls.Certificate, error)) EvidenceFetcher {
	return EvidenceFetcher{Certificate: cert, Dialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}}
}

// fetchBeforeTheDoor fetches as clients from before issue 32 did: the
// attested handshake at once, no door.
func fetchBeforeTheDoor(ctx context.Context, addr string, verifiers []attestation.Verifier) (*attestation.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	cfg, verified, err := clientConfig(ctx, Config{Verifiers: verifiers})
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	tconn := tls.Client(conn, cfg)
	if err := tconn.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	return finishFetch(ctx, addr, tconn, verified)
}

// cluster is a cluster CA with the client certificates callers present,
// as clusterpki issues them (clusterpki's tests check its issuers; this
// test binary stays clear of the Kubernetes libraries, docs/development.md).
type cluster struct {
	ca     *testkit.CA
	caFile string
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	return &cluster{ca: testkit.NewCA(t, "kubernetes"), caFile: filepath.Join(t.TempDir(), "ca.crt")}
}

// join writes the cluster CA where the node reads it, as kubeadm join does.
func (c *cluster) join(t testing.TB) {
	t.Helper()
	if err := os.WriteFile(c.caFile, c.ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
}

// verifier is the join service's client certificate
// (clusterpki.NewVerifierIdentity).
func (c *cluster) verifier(t *testing.T) func() (*tls.Certificate, error) {
	t.Helper()
	return c.signed(t, pkix.Name{CommonName: "gatehouse-joinservice", Organization: []string{"gatehouse:verifiers"}}, x509.ExtKeyUsageClientAuth, time.Now())
}

// admin is an administrator's certificate (clusterpki's SignAdmin,
// kubeadm's admin.conf: O=kubeadm:cluster-admins).
func (c *cluster) admin(t *testing.T) func() (*tls.Certificate, error) {
	t.Helper()
	return c.signed(t, pkix.Name{CommonName: "alice", Organization: []string{"kubeadm:cluster-admins"}}, x509.ExtKeyUsageClientAuth, time.Now())
}

// kubelet is a node's kubelet client certificate (clusterpki's
// SignKubeletClient: O=system:nodes).
func (c *cluster) kubelet(t *testing.T) func() (*tls.Certificate, error) {
	t.Helper()
	return c.signed(t, pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}}, x509.ExtKeyUsageClientAuth, time.Now())
}

// signed is a certificate of the cluster CA for subject, with usage,
// valid from notBefore (backdated 5 minutes) for an hour.
func (c *cluster) signed(t *testing.T, subject pkix.Name, usage x509.ExtKeyUsage, notBefore time.Time) func() (*tls.Certificate, error) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial, Subject: subject,
		NotBefore: notBefore.Add(-5 * time.Minute), NotAfter: notBefore.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}, c.ca.Cert, key.Public(), c.ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return func() (*tls.Certificate, error) {
		return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
	}
}

// clock is a clock tests move by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// clientHello returns the first TLS record a client with protos sends:
// what a flooder replays without doing any crypto of its own.
func clientHello(t testing.TB, protos []string) []byte {
	t.Helper()
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(client, &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: protos, InsecureSkipVerify: true}).Handshake()
	}()
	header := make([]byte, 5)
	if _, err := io.ReadFull(server, header); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(header[3])<<8|int(header[4]))
	if _, err := io.ReadFull(server, body); err != nil {
		t.Fatal(err)
	}
	_ = server.Close()
	_ = client.Close()
	<-done
	return append(header, body...)
}

// nonceProto is an attested ClientHello's nonce protocol.
func nonceProto() string {
	return noncePrefix + hex.EncodeToString(make([]byte, attestation.NonceSize))
}
