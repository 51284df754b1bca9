package build

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// heartbeat is how often a long step says it is still running.
const heartbeat = 15 * time.Second

// progress prints numbered steps with the time since the build started,
// as `gatehouse mini up` does, and while a step runs a line every
// heartbeat, so a user never watches a silent terminal. It is safe for
// concurrent use.
type progress struct {
	out   io.Writer
	start time.Time
	mu    sync.Mutex
	n     int
}

func newProgress(out io.Writer) *progress {
	if out == nil {
		out = io.Discard
	}
	return &progress{out: out, start: time.Now()}
}

func (p *progress) elapsed() time.Duration { return time.Since(p.start) }

func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "[%6.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// step prints what as the next numbered step, runs fn, and says how long
// it took; errors are wrapped with what failed.
func (p *progress) step(what string, fn func() error) error {
	p.mu.Lock()
	p.n++
	n := p.n
	p.mu.Unlock()
	p.printf("%d. %s", n, what)
	began := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.printf("   step %d still running: %s", n, time.Since(began).Round(time.Second))
			}
		}
	}()
	err := fn()
	close(done)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("%s: %w", lowerFirst(what), err)
	}
	p.printf("   done in %s", time.Since(began).Round(100*time.Millisecond))
	return nil
}

// detail prints a line about the current step.
func (p *progress) detail(format string, args ...any) {
	p.printf("   "+format, args...)
}

// lowerFirst makes a step's name the start of an error message.
func lowerFirst(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	return strings.ToLower(string(unicode.ToLower(r))) + s[n:]
}
