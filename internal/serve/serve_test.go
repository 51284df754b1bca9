package serve

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// TestRunServesUntilCancelled: both servers answer while ctx lives; after
// cancel, Run returns nil and both are closed (goleak checks their
// goroutines are gone).
func TestRunServesUntilCancelled(t *testing.T) {
	grpcServer := grpc.NewServer()
	healthpb.RegisterHealthServer(grpcServer, health.NewServer())
	lis := listen(t)
	httpLis := listen(t)
	httpAddr := httpLis.Addr().String()
	_ = httpLis.Close() // Run listens on the address itself
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	httpServer := &http.Server{Addr: httpAddr, Handler: mux, ReadHeaderTimeout: time.Second}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, slog.New(slog.DiscardHandler), "Test service", grpcServer, lis, httpServer) }()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The gRPC listener is open before Run starts; the HTTP one is opened
	// by Run, so poll it with a deadline.
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("gRPC health check: %v", err)
	}
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get("http://" + httpAddr + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("HTTP server never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	client.CloseIdleConnections()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if _, err := net.DialTimeout("tcp", httpAddr, time.Second); err == nil {
		t.Error("the HTTP server still accepts connections after Run returned")
	}
}

// TestRunReportsHTTPListenError: an HTTP address that is taken is an
// error, and the gRPC listener is closed rather than left open.
func TestRunReportsHTTPListenError(t *testing.T) {
	taken := listen(t)
	defer taken.Close()
	lis := listen(t)
	httpServer := &http.Server{Addr: taken.Addr().String(), ReadHeaderTimeout: time.Second}
	err := Run(t.Context(), slog.New(slog.DiscardHandler), "Test service", grpc.NewServer(), lis, httpServer)
	if err == nil {
		t.Fatal("Run with a taken HTTP address returned nil")
	}
	if _, err := net.DialTimeout("tcp", lis.Addr().String(), time.Second); err == nil {
		t.Error("the gRPC listener is still open after Run failed")
	}
}
