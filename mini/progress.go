package mini

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progress prints numbered steps with the time since the start. Steps
// may run at the same time: it is safe for concurrent use.
type progress struct {
	out   io.Writer
	start time.Time
	mu    sync.Mutex
	n     int
}

func (p *progress) step(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	fmt.Fprintf(p.out, "[%5.1fs] %d. %s\n", time.Since(p.start).Seconds(), p.n, fmt.Sprintf(format, args...))
}

// detail prints a line about the current step with the time since the
// start.
func (p *progress) detail(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "[%5.1fs]   %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// timedLines passes the init's progress on, a line at a time, each with
// the time since mini up started.
type timedLines struct {
	p    *progress
	line []byte
}

func (t *timedLines) Write(b []byte) (int, error) {
	for _, c := range b {
		if c == '\n' {
			t.p.detail("%s", t.line)
			t.line = t.line[:0]
			continue
		}
		t.line = append(t.line, c)
	}
	return len(b), nil
}

func (t *timedLines) flush() {
	if len(t.line) > 0 {
		t.p.detail("%s", t.line)
		t.line = nil
	}
}
