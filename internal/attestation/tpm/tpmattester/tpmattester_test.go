package tpmattester

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// stuckTPM is the simulator with a switch that holds every TPM response
// until released: a TPM busy with a slow command.
type stuckTPM struct {
	io.ReadWriter
	mu      sync.Mutex
	hold    chan struct{} // non-nil while responses are held
	entered chan struct{} // closed when a command waits for its held response
}

func (s *stuckTPM) Read(p []byte) (int, error) {
	s.mu.Lock()
	hold, entered := s.hold, s.entered
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-entered:
		default:
			close(entered)
		}
		<-hold
	}
	return s.ReadWriter.Read(p)
}

// stick holds responses from now on and returns the function releasing
// them and a channel closed once a command is held.
func (s *stuckTPM) stick() (release func(), entered <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hold, in := make(chan struct{}), make(chan struct{})
	s.hold, s.entered = hold, in
	return func() {
		s.mu.Lock()
		s.hold = nil
		s.mu.Unlock()
		close(hold)
	}, in
}

// TestWaitingForTheTPMEndsWithTheContext: while one quote holds the TPM,
// another caller whose deadline passes returns at once with the deadline's
// error, instead of queueing behind it; once the TPM is free, quotes work.
func TestWaitingForTheTPMEndsWithTheContext(t *testing.T) {
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	rw := &stuckTPM{ReadWriter: sim}
	a, err := New(rw, Options{PCRs: []int{0, 16}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	nonce := make([]byte, attestation.NonceSize)

	release, entered := rw.stick()
	first := make(chan error, 1)
	go func() {
		_, err := a.Attest(context.Background(), []byte("first"), nonce)
		first <- err
	}()
	<-entered // the first quote holds the TPM

	const deadline = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	second := make(chan error, 1)
	go func() {
		_, err := a.Attest(ctx, []byte("second"), nonce)
		second <- err
	}()
	select {
	case err := <-second:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiting quote: %v, want context.DeadlineExceeded", err)
		}
		if took := time.Since(start); took > 40*deadline {
			t.Fatalf("the waiting quote returned after %s, its deadline was %s", took, deadline)
		}
	case <-time.After(10 * time.Second):
		release()
		_, _ = <-first, <-second
		t.Fatal("a quote whose deadline passed still waits for the TPM")
	}

	release()
	if err := <-first; err != nil {
		t.Fatalf("the quote holding the TPM: %v", err)
	}
	if _, err := a.Attest(t.Context(), []byte("third"), nonce); err != nil {
		t.Fatalf("a quote after the TPM was freed: %v", err)
	}
	done, cancelDone := context.WithCancel(t.Context())
	cancelDone()
	if _, err := a.Attest(done, []byte("fourth"), nonce); !errors.Is(err, context.Canceled) {
		t.Fatalf("a quote with an ended context: %v, want context.Canceled", err)
	}
}
