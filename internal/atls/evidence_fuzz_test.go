package atls

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// FuzzEvidenceDoor sends what a caller on the node network chooses (any
// bytes as the connection's first flight) to a node that belongs to a
// cluster: the endpoint must never panic, and never quote for a caller
// without a certificate.
func FuzzEvidenceDoor(f *testing.F) {
	pair := newTPMPair(f)
	c := newCluster(f)
	c.join(f)
	a := &countingAttester{Attester: pair.attester}
	s, err := EvidenceEndpoint{Attester: a, ClientCAFile: c.caFile, HandshakeTimeout: time.Second}.newServer()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(clientHello(f, []string{"h2", nonceProto()}))
	f.Add(clientHello(f, []string{evidenceProtocol, "h2", nonceProto()}))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x00})
	var quotes atomic.Int64
	f.Fuzz(func(t *testing.T, flight []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.handle(context.Background(), server)
		}()
		drained := make(chan struct{})
		go func() { // net.Pipe is synchronous: read what the server answers
			defer close(drained)
			_, _ = io.Copy(io.Discard, client)
		}()
		_, _ = client.Write(flight)
		_ = client.Close()
		<-done
		<-drained
		if n := a.calls.Load(); n != quotes.Load() {
			quotes.Store(n)
			t.Fatalf("a quote for %d bytes sent without a certificate", len(flight))
		}
	})
}
