package joinservice

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"syscall"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
)

// measurementsDigest fingerprints verified measurements (index, value pairs
// in index order), so the audit log groups nodes running the same software
// without listing every value.
func measurementsDigest(m map[uint32][]byte) string {
	if len(m) == 0 {
		return ""
	}
	var buf []byte
	for _, i := range slices.Sorted(maps.Keys(m)) {
		buf = binary.BigEndian.AppendUint32(buf, i)
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(m[i])))
		buf = append(buf, m[i]...)
	}
	return policy.Fingerprint(buf)
}

// handshakeReason classifies a failed attested TLS handshake for metrics
// and the audit log.
func handshakeReason(err error) string {
	for _, c := range []struct {
		target error
		reason string
	}{
		{attestation.ErrMeasurement, "measurement_mismatch"},
		{attestation.ErrUntrustedKey, "untrusted_key"},
		{attestation.ErrActivation, "activation_failed"},
		{attestation.ErrNonce, "evidence_nonce"},
		{attestation.ErrSignature, "evidence_signature"},
		{attestation.ErrPolicy, "evidence_policy"},
		{attestation.ErrMalformed, "evidence_malformed"},
		{atls.ErrNoEvidence, "no_evidence"},
		{atls.ErrNoCertificate, "no_evidence"},
		{atls.ErrUnknownVariant, "unknown_variant"},
		{atls.ErrNotSelfSigned, "no_evidence"},
		{atls.ErrKeyBinding, "key_binding"},
		{atls.ErrCertExpired, "certificate_expired"},
		{atls.ErrNoNonce, "no_nonce"},
	} {
		if errors.Is(err, c.target) {
			return c.reason
		}
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return "handshake_timeout"
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) {
		return "aborted"
	}
	return "tls_error"
}

// observeHandshake counts and audits every refused attested TLS
// handshake, the point where unattested and wrongly measured callers are
// turned away. Aborted connections (TCP probes, scanners) are only
// counted.
func (s *Server) observeHandshake(conn net.Conn, err error) {
	m := s.metrics
	m.attempts.WithLabelValues("handshake").Inc()
	if err == nil {
		m.verdicts.WithLabelValues("handshake", "allowed", "allowed").Inc()
		return
	}
	reason := handshakeReason(err)
	m.verdicts.WithLabelValues("handshake", "refused", reason).Inc()
	if reason != "aborted" {
		s.cfg.Log.LogAttrs(context.Background(), slog.LevelWarn, "audit",
			slog.String("event", "join.decision"),
			slog.String("method", "handshake"),
			slog.String("source", sourceHost(conn.RemoteAddr())),
			slog.String("verdict", "refused"),
			slog.String("reason", reason),
			slog.String("error", err.Error()),
		)
	}
}
