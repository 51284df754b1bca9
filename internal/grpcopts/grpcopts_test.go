package grpcopts

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// recordingListener keeps what the server reads from and writes to each
// connection it accepts.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	read  bytes.Buffer // from the client: the preface, then frames
	wrote bytes.Buffer // to the client: frames
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, l: l}, nil
}

type recordingConn struct {
	net.Conn
	l *recordingListener
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.mu.Lock()
	c.l.read.Write(p[:n])
	c.l.mu.Unlock()
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.l.mu.Lock()
	c.l.wrote.Write(p)
	c.l.mu.Unlock()
	return c.Conn.Write(p)
}

// pings counts the PING frames (acknowledgements included) in an HTTP/2
// frame stream (RFC 9113 §4.1: a 9-byte header of a 24-bit length, the
// type, flags and stream; PING is type 6). The record may end inside the
// last frame: the server, reading without a buffer, takes a frame's header
// and its payload in two reads, and Stop may close the connection between
// them (seen in 3 of 20 runs); that frame counts by its header.
func pings(stream []byte) int {
	n := 0
	for len(stream) >= 9 {
		length := int(stream[0])<<16 | int(stream[1])<<8 | int(stream[2])
		if stream[3] == 0x6 {
			n++
		}
		if len(stream) < 9+length {
			break
		}
		stream = stream[9+length:]
	}
	return n
}

// exchange makes three requests over one connection, with server and
// client options, and returns how many PING frames the server received and
// sent.
func exchange(t *testing.T, server []grpc.ServerOption, client []grpc.DialOption) (received, sent int) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := &recordingListener{Listener: inner}
	srv := grpc.NewServer(server...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client...)...)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_ = conn.Close()
	srv.Stop()
	lis.mu.Lock()
	defer lis.mu.Unlock()
	// The client's bytes start with the connection preface (RFC 9113 §3.4).
	return pings(bytes.TrimPrefix(lis.read.Bytes(), []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))), pings(lis.wrote.Bytes())
}

// TestNoBandwidthProbes checks that a connection with Server's and Dial's
// settings carries no PING frames where gRPC's defaults send a
// bandwidth-probing PING and its acknowledgement for requests and
// responses.
func TestNoBandwidthProbes(t *testing.T) {
	received, sent := exchange(t, nil, nil)
	t.Logf("defaults: %d PINGs received, %d sent", received, sent)
	if received == 0 || sent == 0 {
		t.Fatalf("with gRPC's defaults the server received %d and sent %d PING frames; want some each way (or the test sees nothing)", received, sent)
	}
	if received, sent := exchange(t, Server(), Dial()); received != 0 || sent != 0 {
		t.Errorf("with grpcopts the server received %d and sent %d PING frames, want none", received, sent)
	}
}
