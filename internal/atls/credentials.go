package atls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// AuthInfo is the gRPC peer information of an attested TLS connection; a
// handler gets it with peer.FromContext(ctx).AuthInfo.(atls.AuthInfo).
type AuthInfo struct {
	credentials.TLSInfo
	// Peer is what the peer's evidence proved; nil when this side did not
	// require the peer to attest.
	Peer *attestation.Result
	// Evidence is the evidence Peer was verified from, with its nonce, so
	// the relying party can appraise it again under a changed policy.
	Evidence Evidence
}

// AuthType returns "atls".
func (AuthInfo) AuthType() string { return "atls" }

// Credentials are gRPC transport credentials running attested TLS with a
// fresh key, nonce and evidence for every handshake.
type Credentials struct {
	cfg Config
}

// NewCredentials returns gRPC transport credentials for cfg, usable on both
// client (grpc.WithTransportCredentials) and server (grpc.Creds).
func NewCredentials(cfg Config) (*Credentials, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &Credentials{cfg: cfg}, nil
}

// ClientHandshake runs the client side of attested TLS over conn.
func (c *Credentials) ClientHandshake(ctx context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg, verified, err := clientConfig(ctx, c.cfg)
	if err != nil {
		return nil, nil, err
	}
	return handshake(ctx, tls.Client(conn, cfg), c.cfg.Attester, verified)
}

// ServerHandshake runs the server side of attested TLS over conn.
func (c *Credentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	ctx := context.Background()
	cfg, verified, err := serverConfig(ctx, c.cfg)
	if err != nil {
		return nil, nil, err
	}
	return handshake(ctx, tls.Server(conn, cfg), c.cfg.Attester, verified)
}

func handshake(ctx context.Context, conn *tls.Conn, attester attestation.Attester, verified *peerEvidence) (net.Conn, credentials.AuthInfo, error) {
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("attested TLS handshake: %w", err)
	}
	if err := finish(ctx, conn, attester, verified); err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("attested TLS handshake: %w", err)
	}
	state := conn.ConnectionState()
	if state.NegotiatedProtocol != "h2" {
		_ = conn.Close()
		return nil, nil, errors.New("attested TLS handshake: peer did not negotiate ALPN h2")
	}
	info := AuthInfo{
		TLSInfo: credentials.TLSInfo{
			State:          state,
			CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		},
		Peer:     verified.Result(),
		Evidence: verified.Evidence(),
	}
	return conn, info, nil
}

// Info describes the protocol.
func (c *Credentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "atls"}
}

// Clone returns a copy of the credentials.
func (c *Credentials) Clone() credentials.TransportCredentials {
	return &Credentials{cfg: c.cfg}
}

// OverrideServerName is a no-op: attested TLS does not authenticate names.
//
// Deprecated: required by the gRPC interface only.
func (c *Credentials) OverrideServerName(string) error { return nil }
