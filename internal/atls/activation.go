package atls

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// finish completes a handshake on conn with the key activation exchange
// (attestation.KeyActivation), when either side's evidence asks for one
// (docs/attestation.md, "Endorsed keys"). Frames are a 4-byte big-endian
// length and at most attestation.MaxActivationSize bytes of payload, sent
// over the TLS connection the evidence is bound to, so an answer can
// neither come from another connection nor be replayed into one. Each side
// runs, in this order (no step waits on a write of its own, so mutual
// attestation does not deadlock):
//
//  1. As verifier of a peer whose result carries a KeyActivation: write
//     the challenge.
//  2. As an attester whose evidence requested activation: read the
//     challenge, write the answer (empty when the attester cannot answer).
//  3. As verifier (1): read the answer, compare it with the secret in
//     constant time, write the verdict (empty: accepted; else the reason).
//  4. As attester (2): read the verdict.
//
// On success the verified result no longer carries its KeyActivation.
// Errors wrap attestation.ErrActivation when the activation itself failed.
func finish(ctx context.Context, conn net.Conn, attester attestation.Attester, verified *peerEvidence) error {
	result := verified.Result()
	verifying := result != nil && result.Activation != nil
	activator, attesting := attester.(attestation.Activator)
	attesting = attesting && verified.attested() && activator.RequestsActivation()
	if !verifying && !attesting {
		return nil
	}
	// The exchange ends with ctx; without a deadline in ctx (a gRPC
	// server's handshake) the deadline the server set on the connection
	// for the whole handshake (grpc.ConnectionTimeout, the join service's
	// --handshake-timeout) bounds it, and is not extended here.
	if deadline, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(deadline); err != nil {
			return err
		}
		defer func() { _ = conn.SetDeadline(time.Time{}) }()
	}
	var secret []byte
	if verifying {
		challenge, s, err := result.Activation.Challenge()
		if err != nil {
			return fmt.Errorf("atls: making the key activation challenge: %w", err)
		}
		if err := writeFrame(conn, challenge); err != nil {
			return fmt.Errorf("atls: sending the key activation challenge: %w", err)
		}
		secret = s
	}
	var activateErr error
	if attesting {
		challenge, err := readFrame(conn)
		if err != nil {
			return fmt.Errorf("atls: reading the peer's key activation challenge: %w", err)
		}
		answer, err := activator.Activate(ctx, challenge)
		if err != nil {
			// Tell the verifier, then report this side's reason.
			answer, activateErr = nil, fmt.Errorf("%w: this attester cannot answer the verifier's challenge: %w", attestation.ErrActivation, err)
		}
		if err := writeFrame(conn, answer); err != nil {
			return fmt.Errorf("atls: sending the key activation answer: %w", err)
		}
	}
	if verifying {
		if err := checkAnswer(conn, secret); err != nil {
			return err
		}
		r := *result
		r.Activation = nil
		verified.set(&r, verified.Evidence())
	}
	if attesting {
		if activateErr != nil {
			return activateErr
		}
		verdict, err := readFrame(conn)
		if err != nil {
			return fmt.Errorf("atls: reading the verifier's key activation verdict: %w", err)
		}
		if len(verdict) > 0 {
			return fmt.Errorf("%w: the verifier refused this attester's answer: %s", attestation.ErrActivation, verdict)
		}
	}
	return nil
}

// checkAnswer reads the attester's answer, compares it with secret and
// writes the verdict.
func checkAnswer(conn net.Conn, secret []byte) error {
	answer, err := readFrame(conn)
	if err != nil {
		// A timeout or a closed connection, reported as such.
		return fmt.Errorf("atls: reading the attester's key activation answer: %w", err)
	}
	var refusal string
	switch {
	case len(answer) == 0:
		refusal = "the attester could not recover the challenge's secret: its attestation key is not resident in the TPM " +
			"whose EK certificate it sent"
	case subtle.ConstantTimeCompare(answer, secret) != 1:
		refusal = "the answer is not the challenge's secret: a forged or replayed answer"
	}
	if err := writeFrame(conn, []byte(refusal)); err != nil && refusal == "" {
		return fmt.Errorf("atls: sending the key activation verdict: %w", err)
	}
	if refusal != "" {
		return fmt.Errorf("%w: %s", attestation.ErrActivation, refusal)
	}
	return nil
}

// writeFrame writes payload as one frame of at most
// attestation.MaxActivationSize bytes.
func writeFrame(w io.Writer, payload []byte) error {
	return writeFrameMax(w, payload, attestation.MaxActivationSize)
}

// writeFrameMax writes payload as one frame: a 4-byte big-endian length,
// then the payload, at most limit bytes.
func writeFrameMax(w io.Writer, payload []byte, limit int) error {
	if len(payload) > limit {
		return fmt.Errorf("frame of %d bytes exceeds %d", len(payload), limit)
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(payload)), uint32(len(payload)))
	_, err := w.Write(append(frame, payload...))
	return err
}

// readFrame reads one frame, refusing a length over
// attestation.MaxActivationSize before reading the payload.
func readFrame(r io.Reader) ([]byte, error) {
	return readFrameMax(r, attestation.MaxActivationSize)
}

// readFrameMax reads one frame, refusing a length over limit before
// reading the payload.
func readFrameMax(r io.Reader, limit int) ([]byte, error) {
	var header [4]byte
	if _, err := io.ReadFull(r, header[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(header[:])
	if uint64(n) > uint64(limit) {
		return nil, fmt.Errorf("%w: frame of %d bytes exceeds %d", attestation.ErrMalformed, n, limit)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, errors.Join(errors.New("truncated frame"), err)
	}
	return payload, nil
}
