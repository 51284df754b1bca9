package keyservice

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"k8s.io/apimachinery/pkg/util/wait"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// harness is a key service on loopback with mutual TLS.
type harness struct {
	addr     string
	ca       *testkit.CA
	serverCA *x509.CertPool
	logs     *testkit.LogBuffer
	reg      *prometheus.Registry
	keys     keySource
	srv      *Server
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
	return newHarnessLogging(t, keys, &testkit.LogBuffer{}, slog.LevelDebug)
}

// newHarnessLogging is newHarness with the logs at level going to sink.
func newHarnessLogging(t testing.TB, keys keySource, sink *testkit.LogBuffer, level slog.Level) *harness {
	t.Helper()
	return startHarness(t, keys, sink, level, connlimit.Limits{Handshakes: connlimit.Rate{Rate: 1000, Burst: 1000}})
}

// startHarness is newHarnessLogging behind the connection limits listen.
func startHarness(t testing.TB, keys keySource, sink *testkit.LogBuffer, level slog.Level, listen connlimit.Limits) *harness {
	t.Helper()
	if keys == nil {
		k, err := kms.NewClusterKMS(testSecret, testSalt)
		if err != nil {
			t.Fatal(err)
		}
		keys = k
	}
	dir := t.TempDir()
	ca := testkit.NewCA(t, "gatehouse-internal-ca")
	certFile, keyFile := testkit.WritePEM(t, dir, "server", ca.Issue(t, "gatehouse-keyservice", true))
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
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
	h.srv = srv
	g := NewGRPCServer(srv, credentials.NewTLS(tlsCfg))
	g.RegisterService(&noopServiceDesc, struct{}{})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis, err := srv.Listen(inner, listen)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	h.addr = lis.Addr().String()
	h.serverCA = x509.NewCertPool()
	h.serverCA.AddCert(ca.Cert)
	return h
}

// dial connects with a client certificate (nil: none).
func (h *harness) dial(t testing.TB, clientCert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: h.serverCA, ServerName: "127.0.0.1"}
	if clientCert != nil {
		// Present it whatever CAs the server names, as an attacker would.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return clientCert, nil }
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
	cert := h.ca.Issue(t, "gatehouse-joinservice", false)
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
		want, _ := reference.GetDataKey(ctx, "2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", int(length))
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
	testkit.AssertNoSecrets(t, h.logs.String(), issued)
	if !strings.Contains(h.logs.String(), `"caller":"gatehouse-joinservice"`) {
		t.Errorf("logs do not name the caller:\n%s", h.logs.String())
	}
}

// failingKeys is a backend that always fails, with a message that must not
// leak into logs as key material.
type failingKeys struct{}

func (failingKeys) GetDataKey(context.Context, string, int) ([]byte, error) {
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
	other := testkit.NewCA(t, "some other CA")
	kubelet := h.ca.Issue(t, "system:node:worker-1", false)
	foreign := other.Issue(t, "gatehouse-joinservice", false)
	tests := []struct {
		name   string
		cert   *tls.Certificate
		reason string
	}{
		{name: "no client certificate", reason: "no_client_certificate"},
		{name: "certificate from another CA", cert: &foreign, reason: "untrusted_client_certificate"},
		{name: "certificate for a name that is not allowed", cert: &kubelet, reason: "client_not_allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := keyservicev1.NewKeyServiceClient(h.dial(t, tt.cert)).GetDataKey(ctx, &keyservicev1.GetDataKeyRequest{DataKeyId: "a", Length: 32})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("error = %v, want the connection refused (Unavailable)", err)
			}
			// The server logs and counts the refusal after the client saw it.
			err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				return strings.Contains(h.logs.String(), `"reason":"`+tt.reason+`"`) &&
					testutil.ToFloat64(h.srv.metrics.handshakes.WithLabelValues("refused", tt.reason)) >= 1, nil
			})
			if err != nil {
				t.Fatalf("no logged and counted refusal %q: %v\n%s", tt.reason, err, h.logs.String())
			}
		})
	}
	testkit.AssertNoSecrets(t, h.logs.String(), [][]byte{testSecret, testSalt})
	if got := counterValue(t, h.reg, "gatehouse_keyservice_requests_total", "OK"); got != 0 {
		t.Errorf("%v keys issued to unauthenticated callers", got)
	}
}

func TestHealth(t *testing.T) {
	h := newHarness(t, nil)
	cert := h.ca.Issue(t, "gatehouse-joinservice", false)
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
