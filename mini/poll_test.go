package mini

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	boom := errors.New("boom")
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		timeout time.Duration
		results []bool // done's answers in turn; then false forever
		err     error
		wantErr string
	}{
		{name: "done at once", ctx: t.Context(), timeout: time.Minute, results: []bool{true}},
		{name: "done on the third call", ctx: t.Context(), timeout: time.Minute, results: []bool{false, false, true}},
		{name: "done's error", ctx: t.Context(), timeout: time.Minute, err: boom, wantErr: "waiting for the thing: boom"},
		{name: "timeout", ctx: t.Context(), timeout: 20 * time.Millisecond, wantErr: "waiting for the thing: gave up after 20ms"},
		{name: "cancelled", ctx: cancelled, timeout: time.Minute, wantErr: "context canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := poll(tt.ctx, time.Millisecond, tt.timeout, "the thing", func() (bool, error) {
				calls++
				if tt.err != nil {
					return false, tt.err
				}
				return calls <= len(tt.results) && tt.results[calls-1], nil
			})
			if tt.wantErr == "" {
				if err != nil || calls != len(tt.results) {
					t.Fatalf("poll = %v after %d calls, want nil after %d", err, calls, len(tt.results))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("poll = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
