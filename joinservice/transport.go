package joinservice

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/grpcopts"
	"github.com/gatehouse-dev/gatehouse/internal/handshake"
)

// ConnectionLimits bound what one connection can hold. Every limit is a
// duration; zero takes the default.
type ConnectionLimits struct {
	// HandshakeTimeout bounds the attested TLS handshake (default 10 s).
	HandshakeTimeout time.Duration
	// MaxAge closes a connection this long after it opened (default 5
	// min), so no attestation outlives it: a node reconnects and attests
	// again. In-flight requests get MaxAgeGrace to finish.
	MaxAge time.Duration
	// MaxAgeGrace is how long requests in flight at MaxAge may run on
	// (default 30 s).
	MaxAgeGrace time.Duration
	// MaxIdle closes a connection without requests for this long (default
	// 1 min).
	MaxIdle time.Duration
}

func (l ConnectionLimits) withDefaults() ConnectionLimits {
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&l.HandshakeTimeout, 10 * time.Second},
		{&l.MaxAge, 5 * time.Minute},
		{&l.MaxAgeGrace, 30 * time.Second},
		{&l.MaxIdle, time.Minute},
	} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	return l
}

// DefaultListenLimits are the join service's per-source limits on new
// connections, applied before the attested handshake: each handshake costs
// the service an evidence verification. A joining node makes one
// connection; retries are seconds apart.
var DefaultListenLimits = connlimit.Limits{Handshakes: connlimit.Rate{Rate: 2, Burst: 20}, PerSource: 16, Total: 1024}

// Listen wraps inner with limits: a connection over a limit is closed at
// once, before any attestation work, counted in
// gatehouse_joinservice_connections_refused_total{reason} and
// gatehouse_joinservice_verdicts_total{method="handshake"}, and audited.
func (s *Server) Listen(inner net.Listener, limits connlimit.Limits) (net.Listener, error) {
	return connlimit.NewListener(inner, limits, connlimit.Options{
		Now: s.cfg.Now, Registerer: s.cfg.Registerer, Subsystem: "joinservice",
		OnRefuse: func(source, reason string) {
			s.metrics.attempts.WithLabelValues("handshake").Inc()
			s.metrics.verdicts.WithLabelValues("handshake", "refused", reason).Inc()
			s.cfg.Log.LogAttrs(context.Background(), slog.LevelWarn, "audit",
				slog.String("event", "join.decision"),
				slog.String("method", "handshake"),
				slog.String("source", source),
				slog.String("verdict", "refused"),
				slog.String("reason", reason),
			)
		},
	})
}

// NewGRPCServer returns a gRPC server with the join service, using creds
// (attested TLS) wrapped so that refused handshakes are audited. It bounds
// request size (maxRequestSize; larger requests are refused, audited and
// counted) and connections by limits, with the transport settings of
// grpcopts (joiners dial with them too). Probes use Ready over plain HTTP
// instead of gRPC health, since a prober cannot attest.
func NewGRPCServer(s *Server, creds credentials.TransportCredentials, limits ConnectionLimits) *grpc.Server {
	limits = limits.withDefaults()
	srv := grpc.NewServer(append([]grpc.ServerOption{
		grpc.Creds(&handshake.ObservedCredentials{TransportCredentials: creds, Observe: s.observeHandshake}),
		grpc.MaxRecvMsgSize(maxRequestSize),
		grpc.ConnectionTimeout(limits.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     limits.MaxIdle,
			MaxConnectionAge:      limits.MaxAge,
			MaxConnectionAgeGrace: limits.MaxAgeGrace,
		}),
		grpc.StatsHandler(&oversizedAudit{s: s}),
	}, grpcopts.Server()...)...)
	joinservicev1.RegisterJoinServiceServer(srv, s)
	return srv
}

// oversizedAudit audits and counts requests gRPC refused for exceeding
// maxRequestSize: gRPC refuses them before any handler runs, so only a
// stats handler sees them.
type oversizedAudit struct {
	s *Server
}

type methodKey struct{}

func (o *oversizedAudit) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, methodKey{}, info.FullMethodName)
}

func (o *oversizedAudit) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	end, ok := rs.(*stats.End)
	if !ok || end.Error == nil {
		return
	}
	st, _ := status.FromError(end.Error)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than max") {
		return
	}
	full, _ := ctx.Value(methodKey{}).(string)
	method := full[strings.LastIndexByte(full, '/')+1:]
	if method != "IssueJoinTicket" && method != "IssueRejoinTicket" {
		method = "unknown"
	}
	o.s.metrics.attempts.WithLabelValues(method).Inc()
	o.s.metrics.verdicts.WithLabelValues(method, "refused", "oversized_request").Inc()
	attrs := []slog.Attr{
		slog.String("event", "join.decision"),
		slog.String("method", method),
		slog.String("verdict", "refused"),
		slog.String("reason", "oversized_request"),
		slog.String("error", st.Message()),
	}
	if p, ok := peer.FromContext(ctx); ok {
		attrs = append(attrs, slog.String("source", sourceHost(p.Addr)))
		if info, ok := p.AuthInfo.(atls.AuthInfo); ok {
			attrs = append(attrs, evidenceSummary(info.Peer))
		}
	}
	o.s.cfg.Log.LogAttrs(ctx, slog.LevelWarn, "audit", attrs...)
}

func (o *oversizedAudit) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (o *oversizedAudit) HandleConn(context.Context, stats.ConnStats) {}
