package atls

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// exporterLabel is the TLS exporter label (RFC 8446 §7.5) of the evidence
// endpoint's channel binding, in the manner of RFC 9266's tls-exporter.
const exporterLabel = "EXPORTER-gatehouse-evidence"

// maxVariantSize bounds the variant frame in bytes.
const maxVariantSize = 64

// channelUserData is the user data of evidence sent over the door: a
// fixed domain separator, so evidence made for an attested handshake
// (whose user data is the hash of a certificate key) can never pass as
// door evidence, nor the reverse.
func channelUserData() []byte {
	h := sha256.Sum256([]byte(evidenceProtocol + " channel-bound evidence"))
	return h[:]
}

// channelNonce is the nonce of evidence sent over the door: the door
// connection's exporter value (attestation.NonceSize bytes) with the
// caller's request nonce as its context (none for the evidence the node
// sends unasked right after the handshake). It is unique to the
// connection and unpredictable to the node (it covers the client's random
// and key share, and each later request's fresh nonce), so evidence bound
// to it is fresh and cannot be relayed: a man in the middle has a
// different exporter on each side.
func channelNonce(cs tls.ConnectionState, request []byte) ([]byte, error) {
	nonce, err := cs.ExportKeyingMaterial(exporterLabel, request, attestation.NonceSize)
	if err != nil {
		return nil, fmt.Errorf("atls: exporting the channel binding: %w", err)
	}
	return nonce, nil
}

// attestChannel is the node's side after the door accepted the caller,
// and for each later request (a nonce) on the connection: quote for the
// connection's exporter, send the variant and the evidence as two frames,
// then run the key activation exchange.
func attestChannel(ctx context.Context, conn *tls.Conn, attester attestation.Attester, request []byte) error {
	nonce, err := channelNonce(conn.ConnectionState(), request)
	if err != nil {
		return err
	}
	evidence, err := attester.Attest(ctx, channelUserData(), nonce)
	if err != nil {
		return fmt.Errorf("atls: attesting: %w", err)
	}
	if err := writeFrameMax(conn, []byte(attester.Variant()), maxVariantSize); err != nil {
		return fmt.Errorf("atls: sending the evidence's variant: %w", err)
	}
	if err := writeFrameMax(conn, evidence, attestation.MaxEvidenceSize); err != nil {
		return fmt.Errorf("atls: sending the evidence: %w", err)
	}
	verified := &peerEvidence{}
	verified.markAttested()
	return finish(ctx, conn, attester, verified)
}

// verifyChannel is the caller's side: read the variant and the evidence
// the node sent over conn, verify them against nonce (the connection's
// channelNonce) with the verifier of that variant, then run the key
// activation exchange.
// Errors wrap ErrUnknownVariant, errEvidenceInvalid (wrapping the
// verifier's error), ErrKeyBinding or attestation.ErrMalformed; a read
// error is returned as it came (the caller tells a refusal alert apart).
func verifyChannel(ctx context.Context, conn net.Conn, nonce []byte, verifiers []attestation.Verifier) (*peerEvidence, error) {
	variant, err := readFrameMax(conn, maxVariantSize)
	if err != nil {
		return nil, err
	}
	evidence, err := readFrameMax(conn, attestation.MaxEvidenceSize)
	if err != nil {
		return nil, fmt.Errorf("reading the evidence: %w", err)
	}
	i := slices.IndexFunc(verifiers, func(v attestation.Verifier) bool { return string(v.Variant()) == string(variant) })
	if i < 0 {
		return nil, fmt.Errorf("%w: the node attests with %q", ErrUnknownVariant, variant)
	}
	result, err := verifyRecovering(ctx, verifiers[i], evidence, nonce)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errEvidenceInvalid, err)
	}
	if string(result.UserData) != string(channelUserData()) {
		return nil, ErrKeyBinding
	}
	verified := &peerEvidence{}
	verified.set(result, Evidence{Data: evidence, Nonce: nonce})
	if err := finish(ctx, conn, nil, verified); err != nil {
		return nil, err
	}
	return verified, nil
}

// serveRequests keeps an accepted door connection for its caller's next
// requests: each a frame holding a fresh nonce (attestation.NonceSize
// bytes), answered as attestChannel does, within the handshake timeout.
// The caller's certificate is judged again before each, against the
// cluster CA and the clock of that moment. It returns when the caller
// sends nothing for the idle timeout, sends anything else, goes away, or
// ctx ends.
func (s *evidenceServer) serveRequests(ctx context.Context, source string, conn *tls.Conn, attester attestation.Attester, r *refusal) {
	if s.idle < 0 {
		return
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	for {
		// Deadlines on a connection follow the real clock.
		if err := conn.SetReadDeadline(time.Now().Add(s.idle)); err != nil {
			return
		}
		request, err := readFrameMax(conn, attestation.NonceSize)
		if err != nil || len(request) != attestation.NonceSize {
			return // idle, gone, or not a request: closed without a word
		}
		if err := s.stillAccepted(conn.ConnectionState(), r); err != nil {
			s.refuse(source, *r, err)
			return
		}
		if err := conn.SetReadDeadline(time.Time{}); err != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		closeAtDeadline := context.AfterFunc(rctx, func() { _ = conn.Close() })
		err = attestChannel(rctx, conn, attester, request)
		kept := closeAtDeadline()
		cancel()
		if err != nil {
			s.refuse(source, *r, err)
			return
		}
		s.served.Inc()
		if !kept {
			return
		}
	}
}

// stillAccepted judges a kept connection's client certificate again, as
// the door would now.
func (s *evidenceServer) stillAccepted(cs tls.ConnectionState, r *refusal) error {
	pool, err := s.clientPool(r)
	if err != nil || pool == nil {
		return err
	}
	return checkClient(cs.PeerCertificates, pool, s.orgs, s.now(), r)
}
