package kms_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

func newSecret(t *testing.T) (secret, salt []byte) {
	t.Helper()
	secret, salt = make([]byte, 32), make([]byte, 32)
	_, _ = rand.Read(secret)
	_, _ = rand.Read(salt)
	return secret, salt
}

// TestWrappedKMSRun checks the schedule: every interval while checks
// succeed, retries from a second, doubling up to the interval, after a
// failure.
func TestWrappedKMSRun(t *testing.T) {
	t.Parallel()
	secret, salt := newSecret(t)
	failing := make(chan bool, 1)
	failing <- false
	clk := clocktesting.NewFakeClock(time.Now())
	checks := make(chan error)
	w := kms.NewWrappedKMS(func(context.Context) ([]byte, []byte, error) {
		f := <-failing
		failing <- f
		if f {
			return nil, nil, errors.New("kms down")
		}
		return bytes.Clone(secret), salt, nil
	}, time.Minute, clk, func(err error) { checks <- err })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	defer func() { cancel(); <-done }()

	next := func(t *testing.T, after time.Duration, wantErr bool) {
		t.Helper()
		// Wait for Run's timer, then move the clock to it.
		deadline := time.Now().Add(10 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("Run set no timer")
			}
			time.Sleep(time.Millisecond)
		}
		clk.Step(after - time.Nanosecond)
		select {
		case err := <-checks:
			t.Fatalf("checked %v early (err %v)", after, err)
		default:
		}
		clk.Step(time.Nanosecond)
		if err := <-checks; (err != nil) != wantErr {
			t.Fatalf("check after %v: err = %v, want error %v", after, err, wantErr)
		}
	}
	if err := <-checks; err != nil {
		t.Fatalf("first check: %v", err)
	}
	next(t, time.Minute, false)
	<-failing
	failing <- true
	next(t, time.Minute, true)
	for _, d := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		next(t, d, true)
	}
	<-failing
	failing <- false
	next(t, 8*time.Second, false)
	next(t, time.Minute, false)
	if ok, _, _ := w.Status(); !ok {
		t.Fatal("not available after a successful check")
	}
}
