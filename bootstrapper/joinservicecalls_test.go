package bootstrapper

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRefusalDetection: how a node tells, from its side of the attested
// handshake, that the join service refused its evidence.
func TestRefusalDetection(t *testing.T) {
	tests := []struct {
		name             string
		err              error
		rejected, closed bool
	}{
		{"bad_certificate alert", status.Error(codes.Unavailable, "connection error: remote error: tls: bad certificate"), true, false},
		{"alert lost to the first write", status.Error(codes.Unavailable, "write tcp 10.88.0.13:59712->10.88.0.10:9090: write: broken pipe"), false, true},
		{"reset", status.Error(codes.Unavailable, "read tcp 10.0.0.2:1->10.0.0.1:9090: read: connection reset by peer"), false, true},
		{"service down", status.Error(codes.Unavailable, "dial tcp 10.0.0.1:9090: connect: connection refused"), false, false},
		{"refused request", status.Error(codes.PermissionDenied, "broken pipe in the message"), false, false},
		{"not a gRPC error", errors.New("broken pipe"), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rejectedEvidence(tt.err); got != tt.rejected {
				t.Errorf("rejectedEvidence = %v, want %v", got, tt.rejected)
			}
			if got := closedAfterHandshake(tt.err); got != tt.closed {
				t.Errorf("closedAfterHandshake = %v, want %v", got, tt.closed)
			}
		})
	}
}
