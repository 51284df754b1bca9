package atls

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// Errors of the evidence endpoint's quote queue, for errors.Is.
var (
	// errQuoteQueueFull means as many quotes as the queue holds were
	// running or waiting: the connection gets no quote.
	errQuoteQueueFull = errors.New("atls: the quote queue is full")
	// errQuoteWaitExpired means the connection's deadline passed (or its
	// server stopped) while its quote waited for its turn.
	errQuoteWaitExpired = errors.New("atls: the handshake deadline passed while waiting for a quote")
)

// quoteQueue bounds the attester's work for one evidence endpoint: one
// quote (or key activation) at a time, at most cap(slots) running or
// waiting, and a waiter leaves as soon as its context ends. Waiters take
// their turn in arrival order (a channel's blocked senders are served
// first in, first out).
type quoteQueue struct {
	slots   chan struct{} // one token per quote running or waiting
	turn    chan struct{} // one token while a quote runs
	pending prometheus.Gauge
}

// newQueue returns a queue where one quote runs and waiting more wait.
func newQueue(waiting int, pending prometheus.Gauge) *quoteQueue {
	return &quoteQueue{slots: make(chan struct{}, waiting+1), turn: make(chan struct{}, 1), pending: pending}
}

// do runs f in its turn. It fails with errQuoteQueueFull at once when the
// queue is full, and with errQuoteWaitExpired (wrapping ctx's cause) as
// soon as ctx ends before the turn came; f gets ctx.
func (q *quoteQueue) do(ctx context.Context, f func(context.Context) error) error {
	select {
	case q.slots <- struct{}{}:
	default:
		return errQuoteQueueFull
	}
	q.pending.Inc()
	defer func() {
		q.pending.Dec()
		<-q.slots
	}()
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("%w: %w", errQuoteWaitExpired, err)
	}
	select {
	case q.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errQuoteWaitExpired, context.Cause(ctx))
	}
	defer func() { <-q.turn }()
	return f(ctx)
}

// queued returns a that takes every quote and key activation of one
// connection through q, recording in r why the queue refused one
// (crypto/tls reports a handshake whose deadline passed as the context's
// error, whatever the certificate callback returned); it is an
// attestation.Activator exactly when a is one, so the key activation
// exchange (finish) sees what a asks for.
func queued(a attestation.Attester, q *quoteQueue, r *refusal) attestation.Attester {
	qa := queuedAttester{inner: a, q: q, r: r}
	if act, ok := a.(attestation.Activator); ok {
		return queuedActivator{queuedAttester: qa, act: act}
	}
	return qa
}

type queuedAttester struct {
	inner attestation.Attester
	q     *quoteQueue
	r     *refusal
}

// do runs f through the queue, recording a refusal of the queue.
func (a queuedAttester) do(ctx context.Context, f func(context.Context) error) error {
	err := a.q.do(ctx, f)
	switch {
	case errors.Is(err, errQuoteQueueFull):
		a.r.reason = ReasonQueueFull
	case errors.Is(err, errQuoteWaitExpired):
		a.r.reason = ReasonQuoteWaitExpired
	}
	return err
}

func (a queuedAttester) Variant() attestation.Variant { return a.inner.Variant() }

func (a queuedAttester) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	var evidence []byte
	err := a.do(ctx, func(ctx context.Context) error {
		var err error
		evidence, err = a.inner.Attest(ctx, userData, nonce)
		return err
	})
	return evidence, err
}

type queuedActivator struct {
	queuedAttester
	act attestation.Activator
}

func (a queuedActivator) RequestsActivation() bool { return a.act.RequestsActivation() }

func (a queuedActivator) Activate(ctx context.Context, challenge []byte) ([]byte, error) {
	var answer []byte
	err := a.do(ctx, func(ctx context.Context) error {
		var err error
		answer, err = a.act.Activate(ctx, challenge)
		return err
	})
	return answer, err
}
