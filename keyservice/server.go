// Package keyservice is the Gatehouse key service: a gRPC server handing the
// join service the cluster's data-encryption keys over mutually
// authenticated TLS (docs/keys.md).
package keyservice

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/grpcopts"
	"github.com/gatehouse-dev/gatehouse/internal/handshake"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/protostrict"
)

// keySource returns data keys; declared here, where it is used.
type keySource interface {
	GetDataKey(ctx context.Context, id string, length int) ([]byte, error)
}

// Server implements KeyService.
type Server struct {
	keyservicev1.UnimplementedKeyServiceServer
	keys    keySource
	log     *slog.Logger
	metrics *metrics
}

// NewServer returns a key service over keys, logging to log and registering
// its metrics with reg.
func NewServer(keys keySource, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Server{keys: keys, log: log, metrics: m}, nil
}

// GetDataKey returns the data key for the request's id and length.
// Errors: InvalidArgument for an empty or malformed id or a length outside
// 1-64, naming which; Unavailable when the backend fails; Canceled and
// DeadlineExceeded as the caller's context says.
func (s *Server) GetDataKey(ctx context.Context, req *keyservicev1.GetDataKeyRequest) (*keyservicev1.GetDataKeyResponse, error) {
	start := time.Now()
	key, err := s.getDataKey(ctx, req)
	code := status.Code(err)
	s.metrics.observe(code, time.Since(start))
	if err == nil && !s.log.Enabled(ctx, slog.LevelDebug) {
		return &keyservicev1.GetDataKeyResponse{DataKey: key}, nil
	}
	caller := callerName(ctx)
	attrs := []any{
		slog.String("dataKeyID", req.GetDataKeyId()),
		slog.Uint64("length", uint64(req.GetLength())),
		slog.String("caller", caller),
		slog.String("code", code.String()),
		slog.Duration("duration", time.Since(start)),
	}
	if err != nil {
		s.log.WarnContext(ctx, "Data key request failed", append(attrs, slog.String("error", err.Error()))...)
		return nil, err
	}
	// Issued keys are counted in metrics and audited by the join service,
	// which decides who gets them; a line per key here is for debugging.
	s.log.DebugContext(ctx, "Data key issued", attrs...)
	return &keyservicev1.GetDataKeyResponse{DataKey: key}, nil
}

func (s *Server) getDataKey(ctx context.Context, req *keyservicev1.GetDataKeyRequest) ([]byte, error) {
	if req.GetLength() > keys.MaxDataKeySize {
		return nil, status.Errorf(codes.InvalidArgument, "length %d is outside 1-%d bytes", req.GetLength(), keys.MaxDataKeySize)
	}
	if err := protostrict.CheckUnknown(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := keys.CheckRequest(req.GetDataKeyId(), int(req.GetLength())); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	key, err := s.keys.GetDataKey(ctx, req.GetDataKeyId(), int(req.GetLength()))
	var unavailable *kms.UnavailableError
	switch {
	case err == nil:
		return key, nil
	case errors.As(err, &unavailable):
		return nil, status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled):
		return nil, status.Error(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return nil, status.Error(codes.DeadlineExceeded, "request deadline exceeded")
	default:
		return nil, status.Errorf(codes.Unavailable, "key backend: %v", err)
	}
}

// callerName is the common name of the caller's verified client certificate.
func callerName(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return ""
	}
	return info.State.VerifiedChains[0][0].Subject.CommonName
}

// TLSFiles names the PEM files of the service's mutual TLS.
type TLSFiles struct {
	// Cert and Key are the server's certificate and key.
	Cert, Key string
	// ClientCA verifies client certificates: the CA of Gatehouse's internal
	// services, not the Kubernetes CA (which also signs every kubelet).
	ClientCA string
}

// ServerTLSConfig returns a TLS 1.3 configuration that requires a client
// certificate issued by the client CA whose common name is in
// allowedClients (e.g. "gatehouse-joinservice").
func ServerTLSConfig(files TLSFiles, allowedClients []string) (*tls.Config, error) {
	if len(allowedClients) == 0 {
		return nil, errors.New("no allowed client names: name at least the join service")
	}
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		return nil, fmt.Errorf("loading server certificate: %w", err)
	}
	caPEM, err := os.ReadFile(files.ClientCA)
	if err != nil {
		return nil, fmt.Errorf("reading client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("client CA %s holds no PEM certificate", files.ClientCA)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || !slices.Contains(allowedClients, cs.VerifiedChains[0][0].Subject.CommonName) {
				return fmt.Errorf("client certificate name is not one of %v", allowedClients)
			}
			return nil
		},
	}, nil
}

// NewGRPCServer returns a gRPC server with the key service and the gRPC
// health service (reporting SERVING for "" and the key service) on creds
// (mutual TLS), wrapped so every refused handshake is logged and counted;
// a handshake may take at most handshakeTimeout. Its messages are small,
// so it takes grpcopts' transport settings, as the join service's client
// does.
func NewGRPCServer(s *Server, creds credentials.TransportCredentials) *grpc.Server {
	srv := grpc.NewServer(append([]grpc.ServerOption{
		grpc.Creds(&handshake.ObservedCredentials{TransportCredentials: creds, Observe: s.observeHandshake}),
		grpc.MaxRecvMsgSize(4 << 10), grpc.ConnectionTimeout(handshakeTimeout),
	}, grpcopts.Server()...)...)
	keyservicev1.RegisterKeyServiceServer(srv, s)
	hs := health.NewServer()
	hs.SetServingStatus(keyservicev1.KeyService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	return srv
}
