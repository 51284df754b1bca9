package kms

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// External returns the WrappedSecret of a parsed external KMS URI, and
// whether uri is one.
func External(uri any) (WrappedSecret, bool) {
	switch u := uri.(type) {
	case *AWSKMSURI:
		return u.WrappedSecret, true
	case *VaultTransitURI:
		return u.WrappedSecret, true
	}
	return WrappedSecret{}, false
}

// WithWrapped returns a copy of the external KMS URI uri carrying w.
func WithWrapped(uri any, w WrappedSecret) (string, error) {
	switch u := uri.(type) {
	case *AWSKMSURI:
		c := *u
		c.WrappedSecret = w
		return c.String(), nil
	case *VaultTransitURI:
		c := *u
		c.WrappedSecret = w
		return c.String(), nil
	}
	return "", fmt.Errorf("%T is not an external KMS URI", uri)
}

// DefaultCheckInterval is how often a WrappedKMS asks its KMS again while
// it holds the master secret.
const DefaultCheckInterval = time.Minute

// minRetry is the first retry's delay after a failed check; retries back
// off to the check interval.
const minRetry = time.Second

// WrappedKMS derives keys like ClusterKMS from a master secret that is
// stored only wrapped by an external KMS's KEK. It unwraps the secret at
// start and again every check interval, holding it only in memory; while
// the last check failed (the KMS down, the key disabled, the credentials
// revoked) it has no secret and every request fails with an
// *UnavailableError naming the reason, so the key service answers
// Unavailable. A check that unwraps a different master secret than the one
// held (the URI replaced by another cluster's) is refused the same way: a
// re-wrapped URI of the same secret (Rewrap) takes over without a gap.
type WrappedKMS struct {
	load     func(context.Context) (secret, salt []byte, err error)
	interval time.Duration
	clock    clock.Clock
	report   func(error)

	mu sync.RWMutex
	// derive is nil while unavailable; held is the secret it was made from.
	derive   *ClusterKMS
	held     []byte
	lastErr  error
	lastGood time.Time
}

// UnavailableError says why a WrappedKMS cannot derive keys now.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string {
	return "the master secret is not unwrapped (its KMS must answer before keys are served): " + e.Err.Error()
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// NewWrappedKMS returns a WrappedKMS that unwraps with load (which reads
// the current URI, e.g. from a mounted Secret, and calls UnwrapURI); it
// holds no secret until Check or Run succeeds. report, if not nil, is
// called with every check's result (for logs and metrics).
func NewWrappedKMS(load func(context.Context) (secret, salt []byte, err error), interval time.Duration, clk clock.Clock, report func(error)) *WrappedKMS {
	if report == nil {
		report = func(error) {}
	}
	return &WrappedKMS{load: load, interval: interval, clock: clk, report: report, lastErr: errors.New("not checked yet")}
}

// Check asks the KMS now: on success the unwrapped secret is (still) held,
// on failure it is dropped. It returns the check's error, as it reports it.
func (k *WrappedKMS) Check(ctx context.Context) error {
	err := k.check(ctx)
	k.report(err)
	return err
}

func (k *WrappedKMS) check(ctx context.Context) error {
	secret, salt, err := k.load(ctx)
	var derive *ClusterKMS
	if err == nil {
		derive, err = NewClusterKMS(secret, salt)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err == nil && k.held != nil && (subtle.ConstantTimeCompare(k.held, secret) != 1) {
		err = errors.New("the KMS URI now unwraps to a different master secret than the one this key service holds: " +
			"restore the cluster's own wrapped secret (gatehouse-master-secret.json) or restart the key service")
	}
	if err != nil {
		k.derive, k.lastErr = nil, err
		clear(k.held)
		k.held = nil
		return err
	}
	k.derive, k.held, k.lastErr, k.lastGood = derive, bytes.Clone(secret), nil, k.clock.Now()
	clear(secret)
	return nil
}

// Status reports whether keys are served now, when a check last succeeded
// (zero if never), and the last check's error.
func (k *WrappedKMS) Status() (available bool, lastGood time.Time, lastErr error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.derive != nil, k.lastGood, k.lastErr
}

// Run checks at once (after an interval if a check just succeeded) and then
// every check interval while checks succeed;
// after a failure it retries after a second, doubling up to the interval.
// Run returns when ctx ends.
func (k *WrappedKMS) Run(ctx context.Context) {
	delay := minRetry
	if ok, _, _ := k.Status(); ok {
		// A check just succeeded (the caller's first): the next is due in
		// an interval.
		if !k.wait(ctx, k.interval) {
			return
		}
	}
	for {
		checkCtx, cancel := context.WithTimeout(ctx, k.interval)
		err := k.Check(checkCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		next := k.interval
		if err != nil {
			next, delay = delay, min(2*delay, k.interval)
		} else {
			delay = minRetry
		}
		if !k.wait(ctx, next) {
			return
		}
	}
}

// wait waits d on k's clock; false if ctx ended first.
func (k *WrappedKMS) wait(ctx context.Context, d time.Duration) bool {
	t := k.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// GetDataKey returns the key for id, length bytes long, as ClusterKMS
// does; *UnavailableError while the master secret is not held.
func (k *WrappedKMS) GetDataKey(ctx context.Context, id string, length int) ([]byte, error) {
	k.mu.RLock()
	derive, lastErr := k.derive, k.lastErr
	k.mu.RUnlock()
	if derive == nil {
		return nil, &UnavailableError{Err: lastErr}
	}
	return derive.GetDataKey(ctx, id, length)
}
