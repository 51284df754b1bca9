package atls

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// manInTheMiddle is a man in the middle on the evidence endpoint's path holding a
// certificate the node answers (an insider's): it ends the caller's door
// handshake itself, passes the node's door with its own certificate, and
// relays the node's bytes to the caller unchanged.
func manInTheMiddle(t *testing.T, nodeAddr string, cert func() (*tls.Certificate, error)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	door, err := doorCertificate(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		caller := tls.Server(conn, &tls.Config{
			MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{door},
			NextProtos: []string{evidenceProtocol}, ClientAuth: tls.RequestClientCert,
		})
		if caller.HandshakeContext(t.Context()) != nil {
			return
		}
		node, err := tls.Dial("tcp", nodeAddr, &tls.Config{
			MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, // the attacker checks nothing
			NextProtos:           []string{evidenceProtocol},
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert() },
		})
		if err != nil {
			return
		}
		defer node.Close()
		go func() { _, _ = io.Copy(node, caller) }()
		_, _ = io.Copy(caller, node)
	}()
	return lis.Addr().String()
}

// TestEvidenceIsBoundToTheConnection: the node's evidence is bound to the
// door connection it was made for. Evidence relayed by a man in the middle
// (who passes the node's door with a certificate of its own) is refused,
// as is evidence made for an attested handshake (another user data)
// sent over the door.
func TestEvidenceIsBoundToTheConnection(t *testing.T) {
	pair := newTPMPair(t)
	c := newCluster(t)
	c.join(t)
	ep := serveEndpoint(t, pair, EvidenceEndpoint{ClientCAFile: c.caFile, Limits: generous()}, nil)
	verifiers := []attestation.Verifier{pair.verifier}

	if _, err := fetcher("127.0.0.1", c.verifier(t)).Fetch(t.Context(), ep.addr, verifiers); err != nil {
		t.Fatalf("the direct fetch: %v", err)
	}

	t.Run("relayed by a man in the middle", func(t *testing.T) {
		quotes := ep.attester.calls.Load()
		_, err := fetcher("127.0.0.1", c.verifier(t)).Fetch(t.Context(), manInTheMiddle(t, ep.addr, c.admin(t)), verifiers)
		if !errors.Is(err, errEvidenceInvalid) || !errors.Is(err, attestation.ErrNonce) {
			t.Fatalf("relayed evidence: %v, want ErrEvidenceInvalid wrapping attestation.ErrNonce", err)
		}
		if got := ep.attester.calls.Load() - quotes; got != 1 {
			t.Fatalf("%d quotes, want the relayed one", got)
		}
	})

	t.Run("evidence for another binding", func(t *testing.T) {
		client, server := net.Pipe()
		defer client.Close()
		nonce := make([]byte, attestation.NonceSize)
		go func() {
			defer server.Close()
			// Evidence as the attested handshake makes it: another user data.
			evidence, err := pair.attester.Attest(context.Background(), make([]byte, 32), nonce)
			if err != nil {
				return
			}
			_ = writeFrameMax(server, []byte(pair.attester.Variant()), maxVariantSize)
			_ = writeFrameMax(server, evidence, attestation.MaxEvidenceSize)
		}()
		if _, err := verifyChannel(t.Context(), client, nonce, verifiers); !errors.Is(err, ErrKeyBinding) {
			t.Fatalf("evidence with another user data: %v, want ErrKeyBinding", err)
		}
	})
}

// FuzzChannelEvidence feeds what a node (or anyone answering at its
// address) chooses as its answer to the caller's side of the door: it
// must never panic nor accept evidence.
func FuzzChannelEvidence(f *testing.F) {
	pair := newTPMPair(f)
	verifiers := []attestation.Verifier{pair.verifier}
	nonce := make([]byte, attestation.NonceSize)
	evidence, err := pair.attester.Attest(context.Background(), channelUserData(), make([]byte, attestation.NonceSize))
	if err != nil {
		f.Fatal(err)
	}
	var seed []byte
	for _, frame := range [][]byte{[]byte(pair.attester.Variant()), evidence} {
		seed = append(seed, byte(len(frame)>>24), byte(len(frame)>>16), byte(len(frame)>>8), byte(len(frame)))
		seed = append(seed, frame...)
	}
	f.Add(seed)
	f.Add([]byte("\x00\x00\x00\x03tpm\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, answer []byte) {
		nonce[0]++ // never the nonce the seed's evidence was made for
		client, server := net.Pipe()
		go func() {
			defer server.Close()
			_, _ = server.Write(answer)
			_, _ = io.Copy(io.Discard, server)
		}()
		defer client.Close()
		if v, err := verifyChannel(context.Background(), client, nonce, verifiers); err == nil {
			t.Fatalf("accepted %d bytes as evidence: %+v", len(answer), v.Result())
		}
	})
}
