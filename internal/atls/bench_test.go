package atls

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// BenchmarkHandshake measures one attested TLS handshake over loopback TCP
// with the in-process simulator TPM attesting (mutual: both sides attest and
// verify, sharing the one simulator), and, in the same run, a plain TLS 1.3
// handshake with the same fresh-key certificates but no evidence, which is
// the transport's own cost.
func BenchmarkHandshake(b *testing.B) {
	pair := newTPMPair(b)
	mutual := Config{Attester: pair.attester, Verifiers: []attestation.Verifier{pair.verifier}}
	b.Run("atls-mutual-simulator-tpm", func(b *testing.B) {
		for b.Loop() {
			benchHandshake(b, func(ctx context.Context) (*tls.Config, *tls.Config) {
				sc, _, err := serverConfig(ctx, mutual)
				if err != nil {
					b.Fatal(err)
				}
				cc, _, err := clientConfig(ctx, mutual)
				if err != nil {
					b.Fatal(err)
				}
				return sc, cc
			})
		}
	})
	b.Run("plain-tls13-fresh-keys", func(b *testing.B) {
		plain := &Config{}
		for b.Loop() {
			benchHandshake(b, func(context.Context) (*tls.Config, *tls.Config) {
				serverCert, err := plain.certificate(nil)
				if err != nil {
					b.Fatal(err)
				}
				clientCert, err := plain.certificate(nil)
				if err != nil {
					b.Fatal(err)
				}
				sc := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*serverCert}, ClientAuth: tls.RequireAnyClientCert}
				cc := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*clientCert}, InsecureSkipVerify: true} // baseline without verification
				return sc, cc
			})
		}
	})
}

// benchHandshake runs one handshake over a fresh loopback TCP connection.
func benchHandshake(b *testing.B, configs func(context.Context) (*tls.Config, *tls.Config)) {
	b.Helper()
	ctx := context.Background()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer lis.Close()
	sc, cc := configs(ctx)
	done := make(chan error, 1)
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			done <- err
			return
		}
		tc := tls.Server(conn, sc)
		err = tc.HandshakeContext(ctx)
		_ = tc.Close()
		done <- err
	}()
	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	tc := tls.Client(conn, cc)
	if err := tc.HandshakeContext(ctx); err != nil {
		b.Fatal(err)
	}
	_ = tc.Close()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
