package joinservice

import (
	"net"
	"testing"
	"time"
)

// TestHandshakeTimeout: a client that opens a connection and never
// finishes the attested handshake holds it only for the handshake timeout;
// the refusal is audited and counted.
func TestHandshakeTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{limits: ConnectionLimits{HandshakeTimeout: 300 * time.Millisecond}})
	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Say nothing; the server must give up and close.
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes from a connection that never handshook; want the server to close it", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the server kept a silent connection open for 30 s; want it closed after the handshake timeout")
	}
	h.waitAudit(t, "handshake", "refused", "handshake_timeout")
}
