// Package grpcopts holds the transport settings of Gatehouse's gRPC
// connections that carry a few small messages: every connection to the
// join service (one attested handshake, one or two requests of at most a
// few KiB, a ticket of tens of KiB at most) and the join service's
// connection to the key service (32-byte keys). Both ends of such a
// connection take them.
package grpcopts

import "google.golang.org/grpc"

// window is the static HTTP/2 flow-control window, for each stream and
// for the connection: gRPC's minimum, 64 KiB, more than any message on
// these connections (docs/benchmarks.md, "Join service").
const window = 64 << 10

// Server returns the server options:
//
//   - Static flow-control windows. With dynamic ones (gRPC's default) a
//     side receiving data sends a bandwidth-probing PING, which the other
//     side answers: per request and side, a frame each way with its TLS
//     record and write, to grow a window these messages never fill.
//   - No read buffer. crypto/tls buffers what it reads and decrypts a
//     record at a time, so gRPC's own 32 KiB read buffer per connection
//     only costs memory and garbage collection.
func Server() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.StaticStreamWindowSize(window),
		grpc.StaticConnWindowSize(window),
		grpc.ReadBufferSize(0),
	}
}

// Dial returns the client options, the same settings as Server's.
func Dial() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithStaticStreamWindowSize(window),
		grpc.WithStaticConnWindowSize(window),
		grpc.WithReadBufferSize(0),
	}
}
