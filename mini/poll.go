package mini

import (
	"context"
	"fmt"
	"time"
)

// poll calls done every interval until it reports true, returns an error,
// ctx ends or timeout passes; the last two are errors saying what was
// awaited ("waiting for <what>: ..."). done runs at once first.
func poll(ctx context.Context, interval, timeout time.Duration, what string, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		ok, err := done()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: gave up after %s: %w", what, timeout, ctx.Err())
		case <-ticker.C:
		}
	}
}
