// Package handshake lets a gRPC server see the outcome of every transport
// handshake, so it can audit and count the peers it turns away before any
// request is read (docs/threat-model.md).
package handshake

import (
	"net"

	"google.golang.org/grpc/credentials"
)

// ObservedCredentials wrap server transport credentials and call Observe
// with the connection and the result (nil on success) of each server
// handshake.
type ObservedCredentials struct {
	credentials.TransportCredentials
	Observe func(conn net.Conn, err error)
}

// ServerHandshake runs the wrapped handshake and reports its result.
func (c *ObservedCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	c.Observe(conn, err)
	return out, info, err
}

// Clone returns a copy with a clone of the wrapped credentials.
func (c *ObservedCredentials) Clone() credentials.TransportCredentials {
	return &ObservedCredentials{TransportCredentials: c.TransportCredentials.Clone(), Observe: c.Observe}
}
