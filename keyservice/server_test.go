package keyservice

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

// testCA issues certificates for the test's mutual TLS.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) issue(t testing.TB, cn string, server bool) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t testing.TB, dir, name string, c tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	keyDER, _ := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// syncBuffer is a goroutine-safe log sink; with discard set it drops what
// it gets (benchmarks measure the service, not the rig's log buffer).
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	discard bool
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.discard {
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// harness is a key service on loopback with mutual TLS.
type harness struct {
	addr     string
	ca       *testCA
	serverCA *x509.CertPool
	logs     *syncBuffer
	reg      *prometheus.Registry
	keys     keySource
}

// noopServiceDesc is a test-only service whose one method does nothing: the
// benchmark's baseline for the cost of an RPC on the same server and
// transport.
var noopServiceDesc = grpc.ServiceDesc{
	ServiceName: "gatehouse.test.Noop",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Noop",
		Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := &emptypb.Empty{}
			if err := dec(in); err != nil {
				return nil, err
			}
			return &emptypb.Empty{}, nil
		},
	}},
}

var (
	testSecret = bytes.Repeat([]byte{0x5e}, 32)
	testSalt   = bytes.Repeat([]byte{0x5a}, 32)
)

func newHarness(t testing.TB, keys keySource) *harness {
	t.Helper()
	return newHarnessLogging(t, keys, &syncBuffer{}, slog.LevelDebug)
}

// newHarnessLogging is newHarness with the logs at level going to sink.
func newHarnessLogging(t testing.TB, keys keySource, sink *syncBuffer, level slog.Level) *harness {
	t.Helper()
	if keys == nil {
		k, err := kms.NewClusterKMS(testSecret, testSalt)
		if err != nil {
			t.Fatal(err)
		}
		keys = k
	}
	dir := t.TempDir()
	ca := newTestCA(t, "gatehouse-internal-ca")
	certFile, keyFile := writePEM(t, dir, "server", ca.issue(t, "gatehouse-keyservice", true))
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := ServerTLSConfig(TLSFiles{Cert: certFile, Key: keyFile, ClientCA: caFile}, []string{"gatehouse-joinservice"})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{ca: ca, logs: sink, reg: prometheus.NewRegistry(), keys: keys}
	srv, err := NewServer(keys, slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: level})), h.reg)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPCServer(srv, credentials.NewTLS(tlsCfg))
	g.RegisterService(&noopServiceDesc, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	h.addr = lis.Addr().String()
	h.serverCA = x509.NewCertPool()
	h.serverCA.AddCert(ca.cert)
	return h
}

// dial connects with a client certificate (nil: none).
func (h *harness) dial(t testing.TB, clientCert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: h.serverCA, ServerName: "127.0.0.1"}
	if clientCert != nil {
		cfg.Certificates = []tls.Certificate{*clientCert}
	}
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func (h *harness) joinService(t testing.TB) keyservicev1.KeyServiceClient {
	t.Helper()
	cert := h.ca.issue(t, "gatehouse-joinservice", false)
	return keyservicev1.NewKeyServiceClient(h.dial(t, &cert))
}

func TestGetDataKey(t *testing.T) {
	h := newHarness(t, nil)
	client := h.joinService(t)
	ctx := context.Background()
	reference, _ := kms.NewClusterKMS(testSecret, testSalt)

	var issued [][]byte
	for _, length := range []uint32{1, 32, 64} {
		resp, err := client.GetDataKey(ctx, &keyservicev1.GetDataKeyRequest{DataKeyId: "2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", Length: length})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := reference.GetDEK(ctx, "2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", int(length))
		if !bytes.Equal(resp.GetDataKey(), want) {
			t.Fatalf("length %d: key differs from the HKDF derivation", length)
		}
		issued = append(issued, resp.GetDataKey())
	}

	invalid := []struct {
		name string
		req  *keyservicev1.GetDataKeyRequest
		want string
	}{
		{name: "empty id", req: &keyservicev1.GetDataKeyRequest{Length: 32}, want: "data key id is empty"},
		{name: "bad charset", req: &keyservicev1.GetDataKeyRequest{DataKeyId: "../etc/passwd", Length: 32}, want: "must be 1-128 characters"},
		{name: "length 0", req: &keyservicev1.GetDataKeyRequest{DataKeyId: "a"}, want: "length 0 is outside 1-64 bytes"},
		{name: "length 65", req: &keyservicev1.GetDataKeyRequest{DataKeyId: "a", Length: 65}, want: "length 65 is outside 1-64 bytes"},
		{name: "length 2^32-1", req: &keyservicev1.GetDataKeyRequest{DataKeyId: "a", Length: 1<<32 - 1}, want: "length 4294967295 is outside 1-64 bytes"},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.GetDataKey(ctx, tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}

	if got := counterValue(t, h.reg, "gatehouse_keyservice_requests_total", "OK"); got != 3 {
		t.Errorf("OK requests = %v, want 3", got)
	}
	if got := counterValue(t, h.reg, "gatehouse_keyservice_errors_total", "InvalidArgument"); got != float64(len(invalid)) {
		t.Errorf("InvalidArgument errors = %v, want %d", got, len(invalid))
	}
	assertNoKeyMaterial(t, h.logs.String(), issued)
	if !strings.Contains(h.logs.String(), `"caller":"gatehouse-joinservice"`) {
		t.Errorf("logs do not name the caller:\n%s", h.logs.String())
	}
}

// failingKeys is a backend that always fails, with a message that must not
// leak into logs as key material.
type failingKeys struct{}

func (failingKeys) GetDEK(context.Context, string, int) ([]byte, error) {
	return nil, errors.New("token not present")
}

func TestBackendFailureIsUnavailable(t *testing.T) {
	h := newHarness(t, failingKeys{})
	_, err := h.joinService(t).GetDataKey(context.Background(), &keyservicev1.GetDataKeyRequest{DataKeyId: "a", Length: 32})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("error = %v, want Unavailable", err)
	}
	if !strings.Contains(h.logs.String(), "Data key request failed") {
		t.Errorf("failure not logged:\n%s", h.logs.String())
	}
}

func TestUnauthenticatedCallersAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	other := newTestCA(t, "some other CA")
	kubelet := h.ca.issue(t, "system:node:worker-1", false)
	foreign := other.issue(t, "gatehouse-joinservice", false)
	tests := []struct {
		name string
		cert *tls.Certificate
	}{
		{name: "no client certificate"},
		{name: "certificate from another CA", cert: &foreign},
		{name: "certificate for a name that is not allowed", cert: &kubelet},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := keyservicev1.NewKeyServiceClient(h.dial(t, tt.cert)).GetDataKey(ctx, &keyservicev1.GetDataKeyRequest{DataKeyId: "a", Length: 32})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("error = %v, want the connection refused (Unavailable)", err)
			}
		})
	}
	if got := counterValue(t, h.reg, "gatehouse_keyservice_requests_total", "OK"); got != 0 {
		t.Errorf("%v keys issued to unauthenticated callers", got)
	}
}

func TestHealth(t *testing.T) {
	h := newHarness(t, nil)
	cert := h.ca.issue(t, "gatehouse-joinservice", false)
	health := healthpb.NewHealthClient(h.dial(t, &cert))
	for _, service := range []string{"", keyservicev1.KeyService_ServiceDesc.ServiceName} {
		resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v, %v", service, resp, err)
		}
	}
}

func TestServerTLSConfigErrors(t *testing.T) {
	if _, err := ServerTLSConfig(TLSFiles{}, nil); err == nil || !strings.Contains(err.Error(), "no allowed client names") {
		t.Fatalf("error = %v", err)
	}
	if _, err := ServerTLSConfig(TLSFiles{Cert: "/nonexistent"}, []string{"x"}); err == nil || !strings.Contains(err.Error(), "loading server certificate") {
		t.Fatalf("error = %v", err)
	}
}

// counterValue returns the value of counter name with label code="code".
func counterValue(t *testing.T, reg *prometheus.Registry, name, code string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && l.GetValue() == code {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// assertNoKeyMaterial fails if any key appears in logs raw, as hex (either
// case) or as base64 (standard or URL alphabet, padded or not).
func assertNoKeyMaterial(t *testing.T, logs string, keys [][]byte) {
	t.Helper()
	if logs == "" {
		t.Fatal("no logs captured")
	}
	for _, k := range keys {
		if len(k) < 8 {
			continue // a 1-byte key is in every log; longer ones are the point
		}
		forms := []string{
			string(k), hex.EncodeToString(k), strings.ToUpper(hex.EncodeToString(k)),
			base64.StdEncoding.EncodeToString(k), base64.RawStdEncoding.EncodeToString(k),
			base64.URLEncoding.EncodeToString(k), base64.RawURLEncoding.EncodeToString(k),
		}
		for _, f := range forms {
			if strings.Contains(logs, f) {
				t.Fatalf("logs contain key material (%q)", f)
			}
		}
	}
}
