package atls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// handshakeTimeout bounds one evidence handshake.
const handshakeTimeout = 30 * time.Second

// ServeEvidence answers every connection on lis with an attested TLS
// handshake (fresh evidence for the client's nonce, and the key activation
// the evidence may ask for) and closes it: a verifier such as `gatehouse
// verify` learns what the node runs without any further protocol. It returns when ctx ends or lis fails.
func ServeEvidence(ctx context.Context, lis net.Listener, attester attestation.Attester) error {
	if attester == nil {
		return errors.New("serving evidence: no attester")
	}
	stop := context.AfterFunc(ctx, func() { _ = lis.Close() })
	defer stop()
	for {
		conn, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("serving evidence: %w", err)
		}
		go func() {
			defer conn.Close()
			hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
			defer cancel()
			cfg, verified, err := ServerConfig(hctx, Config{Attester: attester})
			if err != nil {
				return
			}
			tconn := tls.Server(conn, cfg)
			if tconn.HandshakeContext(hctx) == nil {
				_ = finish(hctx, tconn, attester, verified)
			}
		}()
	}
}

// FetchEvidence dials addr (host:port), checks the evidence of the attested
// TLS handshake with verifiers against a fresh nonce, and returns the
// verified result. Errors say whether the node was unreachable or its
// evidence did not verify (wrapping the verifier's error).
func FetchEvidence(ctx context.Context, addr string, verifiers []attestation.Verifier) (*attestation.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	cfg, verified, err := ClientConfig(ctx, Config{Verifiers: verifiers})
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	defer conn.Close()
	tconn := tls.Client(conn, cfg)
	if err := tconn.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("attested TLS handshake with %s: %w", addr, err)
	}
	if err := finish(ctx, tconn, nil, verified); err != nil {
		return nil, fmt.Errorf("attested TLS handshake with %s: %w", addr, err)
	}
	r := verified.Result()
	if r == nil {
		return nil, fmt.Errorf("%s sent no evidence", addr)
	}
	return r, nil
}
