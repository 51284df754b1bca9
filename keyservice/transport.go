package keyservice

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// handshakeTimeout bounds a mutual TLS handshake.
const handshakeTimeout = 10 * time.Second

// DefaultListenLimits bound new connections: the key service has one
// caller, the join service on the control planes, which keeps its
// connections open.
var DefaultListenLimits = connlimit.Limits{Handshakes: connlimit.Rate{Rate: 5, Burst: 20}, PerSource: 8, Total: 256}

// Listen wraps inner with limits: a connection over a limit is closed
// before the TLS handshake, logged and counted in
// gatehouse_keyservice_connections_refused_total{reason}.
func (s *Server) Listen(inner net.Listener, limits connlimit.Limits) (net.Listener, error) {
	return connlimit.NewListener(inner, limits, connlimit.Options{
		Registerer: s.metrics.reg, Subsystem: "keyservice",
		OnRefuse: func(source, reason string) {
			s.metrics.handshakes.WithLabelValues("refused", reason).Inc()
			s.log.Warn("Connection refused before the handshake", "event", "keyservice.handshake", "source", source, "reason", reason)
		},
	})
}

// handshakeReason classifies a refused mutual TLS handshake.
func handshakeReason(err error) string {
	var unknownCA x509.UnknownAuthorityError
	msg := err.Error()
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "handshake_timeout"
	case errors.As(err, &unknownCA) || strings.Contains(msg, "unknown certificate authority"):
		return "untrusted_client_certificate"
	case strings.Contains(msg, "client didn't provide a certificate"):
		return "no_client_certificate"
	case strings.Contains(msg, "client certificate name is not one of"):
		return "client_not_allowed"
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed):
		return "aborted"
	}
	return "tls_error"
}

// observeHandshake logs and counts every refused handshake: a caller
// without a certificate, with one from another CA, or with a name not
// allowed. Aborted connections (probes, scanners) are only counted.
func (s *Server) observeHandshake(conn net.Conn, err error) {
	m := s.metrics.handshakes
	if err == nil {
		m.WithLabelValues("allowed", "allowed").Inc()
		return
	}
	reason := handshakeReason(err)
	m.WithLabelValues("refused", reason).Inc()
	if reason != "aborted" {
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "Handshake refused",
			slog.String("event", "keyservice.handshake"),
			slog.String("source", connlimit.Source(conn.RemoteAddr())),
			slog.String("reason", reason),
			slog.String("error", err.Error()),
		)
	}
}
