package atls

import (
	"context"
	"crypto"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

func TestServeAndFetchEvidence(t *testing.T) {
	pair := newTPMPair(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- ServeEvidence(ctx, lis, pair.attester) }()

	for range 2 { // every connection gets fresh evidence
		r, err := FetchEvidence(t.Context(), lis.Addr().String(), []attestation.Verifier{pair.verifier})
		if err != nil {
			t.Fatal(err)
		}
		if r.Variant != attestation.VariantTPM || len(r.Measurements) != len(pcrs) {
			t.Fatalf("result %+v", r)
		}
	}

	// Evidence that does not match is an error naming the mismatch.
	wrong, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{
		PCRs:            pcrs,
		ReferenceValues: measurements.M{4: {Expected: make([]byte, 32)}},
		Endorsement:     tpm.Endorsement{PinnedKeys: []crypto.PublicKey{pair.attester.AttestationKey()}},
	}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	_, err = FetchEvidence(t.Context(), lis.Addr().String(), []attestation.Verifier{wrong})
	if !errors.Is(err, attestation.ErrMeasurement) {
		t.Fatalf("mismatching evidence: %v, want ErrMeasurement", err)
	}

	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Fatalf("ServeEvidence after cancel: %v", err)
	}
	if _, err := FetchEvidence(t.Context(), lis.Addr().String(), []attestation.Verifier{pair.verifier}); err == nil {
		t.Fatal("fetched evidence from a stopped server")
	}
}
