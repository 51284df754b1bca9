package bootstrapper

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/utils/clock"

	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// InitPortLimits bound what anonymous peers can hold on the init port
// (InitService on a new node, RecoveryService on a rebooted one), so that
// they cannot keep `gatehouse init` or `gatehouse recover` out
// (docs/bootstrapper.md, "Limits").
type InitPortLimits struct {
	// Listen is applied on accept, before any attestation work: new
	// connections per source (each costs a TPM quote), open connections
	// per source and in all, and MaxIdle (zero is the default's). At the
	// total cap the oldest connection without a request in flight is
	// closed to admit the new one (connlimit.Limits.EvictIdle, always on).
	Listen connlimit.Limits
	// HandshakeTimeout bounds the attested TLS handshake; zero is the
	// default's.
	HandshakeTimeout time.Duration
}

// DefaultInitPortLimits are 1 new connection per second per source (5 at
// once), 4 open per source and 64 in all, idle connections closed after
// 10 s, handshakes within 10 s.
var DefaultInitPortLimits = InitPortLimits{
	Listen: connlimit.Limits{
		Handshakes: connlimit.Rate{Rate: 1, Burst: 5}, PerSource: 4, Total: 64,
		MaxIdle: 10 * time.Second, EvictIdle: true,
	},
	HandshakeTimeout: 10 * time.Second,
}

// InitPortConfig holds what ListenInitPort needs.
type InitPortConfig struct {
	// Creds are the node's attested TLS credentials.
	Creds  credentials.TransportCredentials
	Limits InitPortLimits
	// Log records every connection refused or closed by a limit, with its
	// source and reason.
	Log *slog.Logger
	// Registerer registers gatehouse_bootstrapper_connections_{refused,
	// closed}_total{reason} and gatehouse_bootstrapper_connections_open;
	// nil registers nothing.
	Registerer prometheus.Registerer
	// Clock times handshake budgets and idle connections; nil is the real
	// clock.
	Clock clock.WithDelayedExecution
}

// ListenInitPort wraps inner with cfg.Limits and returns it with the gRPC
// server to serve on it: attested TLS with cfg.Creds, handshakes bounded by
// HandshakeTimeout, and the RPCs reported to the listener, which closes
// connections idle for MaxIdle and evicts idle ones at the total cap. Run
// registers InitService or RecoveryService on the server and serves it
// (Config.InitGRPCServer, Config.InitListener). Errors name the bad limit.
func ListenInitPort(inner net.Listener, cfg InitPortConfig) (net.Listener, *grpc.Server, error) {
	if cfg.Creds == nil || cfg.Log == nil {
		return nil, nil, errors.New("init port: Creds and Log are required")
	}
	limits := cfg.Limits
	if limits.Listen.MaxIdle == 0 {
		limits.Listen.MaxIdle = DefaultInitPortLimits.Listen.MaxIdle
	}
	if limits.HandshakeTimeout == 0 {
		limits.HandshakeTimeout = DefaultInitPortLimits.HandshakeTimeout
	}
	if limits.HandshakeTimeout < 0 {
		return nil, nil, fmt.Errorf("init port: handshake timeout %s must be positive", limits.HandshakeTimeout)
	}
	limits.Listen.EvictIdle = true
	lis, err := connlimit.NewListener(inner, limits.Listen, connlimit.Options{
		Clock: cfg.Clock, Registerer: cfg.Registerer, Subsystem: "bootstrapper",
		OnRefuse: func(source, reason string) {
			cfg.Log.Warn("Init port connection refused before the handshake", "source", source, "reason", reason)
		},
		OnClose: func(source, reason string) {
			cfg.Log.Info("Init port connection closed", "source", source, "reason", reason)
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("init port connection limits: %w", err)
	}
	srv := grpc.NewServer(
		grpc.Creds(cfg.Creds),
		grpc.ConnectionTimeout(limits.HandshakeTimeout),
		grpc.StatsHandler(lis.StatsHandler()),
	)
	return lis, srv, nil
}
