package atls

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// TestRejectionTellsEvidenceFromSilence: continuous attestation taints a
// node whose evidence is rejected and only waits out one that does not
// answer, so a rejection classified as silence would let a compromised
// node stay, and silence classified as a rejection would taint an honest
// node over a network blip.
func TestRejectionTellsEvidenceFromSilence(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("fetching the evidence of node-1: %w", err) }
	tests := []struct {
		name          string
		err           error
		isRejection   bool // attestation's appraisal refused the evidence
		fetchRejected bool // the fetch counts it as the node's evidence failing
	}{
		{"malformed", wrap(attestation.ErrMalformed), true, true},
		{"wrong nonce", wrap(attestation.ErrNonce), true, true},
		{"bad signature", wrap(attestation.ErrSignature), true, true},
		{"untrusted key", wrap(attestation.ErrUntrustedKey), true, true},
		{"policy", wrap(attestation.ErrPolicy), true, true},
		{"measurement", wrap(attestation.ErrMeasurement), true, true},
		{"activation", wrap(attestation.ErrActivation), true, true},
		{"did not verify", wrap(fmt.Errorf("%w: %w", errEvidenceInvalid, attestation.ErrMeasurement)), true, true},
		{"unknown variant", wrap(ErrUnknownVariant), false, true},
		{"bound to another key", wrap(ErrKeyBinding), false, true},
		{"deadline", wrap(context.DeadlineExceeded), false, false},
		{"refused connection", wrap(&net.OpError{Op: "dial", Err: errors.New("connection refused")}), false, false},
		{"closed mid-way", wrap(io.ErrUnexpectedEOF), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsRejection(tt.err); got != tt.isRejection {
				t.Errorf("IsRejection(%v) = %v, want %v", tt.err, got, tt.isRejection)
			}
			if got := rejected(tt.err); got != tt.fetchRejected {
				t.Errorf("rejected(%v) = %v, want %v", tt.err, got, tt.fetchRejected)
			}
		})
	}
}
