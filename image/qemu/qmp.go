package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a client of the QEMU Machine Protocol on a Unix socket (QEMU's
// docs/interop/qmp-spec.rst): one JSON object per line; commands are
// answered in order with "return" or "error", and asynchronous "event"s
// come in between. One command is in flight at a time.
type qmp struct {
	conn    net.Conn
	mu      sync.Mutex // one command at a time
	replies chan qmpMessage
	closed  chan struct{} // closed when the reader ends
	readErr error         // set before closed closes
}

// qmpMessage is any message QEMU sends.
type qmpMessage struct {
	Greeting json.RawMessage `json:"QMP,omitempty"`
	Return   json.RawMessage `json:"return,omitempty"`
	Error    *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error,omitempty"`
	Event string          `json:"event,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// errQMPClosed is returned for a command whose connection ended before its
// answer came (as after "quit").
var errQMPClosed = errors.New("QMP connection closed")

// dialQMP connects to QEMU's QMP socket, polling until it accepts or p
// exits, reads the greeting and leaves capabilities negotiation mode.
// onEvent is called on the reader's goroutine for every event.
func dialQMP(ctx context.Context, path string, p *process, onEvent func(name string, data json.RawMessage)) (*qmp, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	var d net.Dialer
	var conn net.Conn
	for {
		var err error
		if conn, err = d.DialContext(ctx, "unix", path); err == nil {
			break
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("QEMU exited before it answered on its QMP socket: %w", p.err)
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to QEMU's QMP socket %s: %w (%w)", path, ctx.Err(), err)
		case <-ticker.C:
		}
	}
	q := &qmp{conn: conn, replies: make(chan qmpMessage, 1), closed: make(chan struct{})}
	greeting := make(chan struct{})
	go q.read(greeting, onEvent)
	select {
	case <-greeting:
	case <-q.closed:
		return nil, fmt.Errorf("reading QMP's greeting: %w", q.readErr)
	case <-ctx.Done():
		_ = conn.Close()
		return nil, fmt.Errorf("reading QMP's greeting: %w", ctx.Err())
	}
	if _, err := q.execute(ctx, "qmp_capabilities", nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return q, nil
}

// read dispatches QEMU's messages until the connection ends.
func (q *qmp) read(greeting chan<- struct{}, onEvent func(string, json.RawMessage)) {
	defer close(q.closed)
	scanner := bufio.NewScanner(q.conn)
	scanner.Buffer(make([]byte, 64<<10), 16<<20)
	for scanner.Scan() {
		var m qmpMessage
		if err := json.Unmarshal(scanner.Bytes(), &m); err != nil {
			q.readErr = fmt.Errorf("QMP sent no JSON object: %w", err)
			return
		}
		switch {
		case m.Greeting != nil:
			close(greeting)
		case m.Event != "":
			onEvent(m.Event, m.Data)
		default:
			q.replies <- m
		}
	}
	q.readErr = scanner.Err()
	if q.readErr == nil {
		q.readErr = errQMPClosed
	}
}

// execute runs one command and returns its "return" value.
func (q *qmp) execute(ctx context.Context, command string, arguments any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	req := map[string]any{"execute": command}
	if arguments != nil {
		req["arguments"] = arguments
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	// The write deadline is this command's; one left from an earlier
	// command's context (the dial's 30 s) would fail every later write.
	deadline, _ := ctx.Deadline()
	_ = q.conn.SetWriteDeadline(deadline)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", command, err)
	}
	select {
	case m := <-q.replies:
		if m.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", command, m.Error.Class, m.Error.Desc)
		}
		return m.Return, nil
	case <-q.closed:
		return nil, fmt.Errorf("QMP %s: %w", command, q.readErr)
	case <-ctx.Done():
		// Its answer may still come: the connection is unusable now.
		_ = q.conn.Close()
		return nil, fmt.Errorf("QMP %s: %w", command, ctx.Err())
	}
}

// close ends the connection and waits for the reader.
func (q *qmp) close() {
	_ = q.conn.Close()
	<-q.closed
}
