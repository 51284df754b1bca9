package atls

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
)

// TestKeyActivationOverGRPC: in every mode, a TPM endorsed only by its EK
// certificate attests, the activation runs inside the handshake, and the
// relying party gets a result with nothing left to answer.
func TestKeyActivationOverGRPC(t *testing.T) {
	ca := swtpmtest.CA(t)
	roots, inter := swtpmtest.Pools(t, ca)
	serverTPM := swtpmtest.Manufacture(t, ca, pcrs, nil)
	clientTPM := swtpmtest.Manufacture(t, ca, pcrs, nil)
	verifier, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: pcrs, Endorsement: tpm.Endorsement{EKRoots: roots, EKIntermediates: inter}}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	verifiers := []attestation.Verifier{verifier}
	tests := []struct {
		name                   string
		server, client         Config
		serverSees, clientSees bool
	}{
		{"server attests", Config{Attester: serverTPM.Attester}, Config{Verifiers: verifiers}, false, true},
		{"client attests", Config{Verifiers: verifiers}, Config{Attester: clientTPM.Attester}, true, false},
		{"mutual", Config{Attester: serverTPM.Attester, Verifiers: verifiers}, Config{Attester: clientTPM.Attester, Verifiers: verifiers}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			serverCreds, err := NewCredentials(tt.server)
			if err != nil {
				t.Fatal(err)
			}
			clientCreds, err := NewCredentials(tt.client)
			if err != nil {
				t.Fatal(err)
			}
			addr, seen := serveHealth(t, serverCreds)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(clientCreds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var p peer.Peer
			if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
				t.Fatalf("health check over attested TLS with key activation: %v", err)
			}
			infos := seen()
			if len(infos) != 1 {
				t.Fatalf("server saw %d calls, want 1", len(infos))
			}
			for _, c := range []struct {
				side string
				sees bool
				r    *attestation.Result
			}{{"client", tt.clientSees, p.AuthInfo.(AuthInfo).Peer}, {"server", tt.serverSees, infos[0].Peer}} {
				if (c.r != nil) != c.sees {
					t.Fatalf("%s has a result: %t, want %t", c.side, c.r != nil, c.sees)
				}
				if c.r == nil {
					continue
				}
				if c.r.Activation != nil {
					t.Errorf("%s's result still asks for activation", c.side)
				}
				if !strings.HasPrefix(c.r.Endorsement, "ek-certificate ") {
					t.Errorf("%s's result endorsement %q, want the EK certificate", c.side, c.r.Endorsement)
				}
			}
		})
	}

	t.Run("evidence endpoint", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- ServeEvidence(ctx, lis, serverTPM.Attester) }()
		defer func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("ServeEvidence ended with %v, want context.Canceled", err)
			}
		}()
		r, err := FetchEvidence(t.Context(), lis.Addr().String(), verifiers)
		if err != nil {
			t.Fatal(err)
		}
		if r.Activation != nil || !strings.HasPrefix(r.Endorsement, "ek-certificate ") {
			t.Fatalf("result %+v, want an activated EK endorsement", r)
		}
	})
}

// clientAttests runs one handshake on loopback TCP in which the client
// attests with attester to a server verifying with verifier, and returns
// both sides' errors.
func clientAttests(t *testing.T, attester attestation.Attester, verifier attestation.Verifier) (serverErr, clientErr error) {
	t.Helper()
	serverCreds, err := NewCredentials(Config{Verifiers: []attestation.Verifier{verifier}})
	if err != nil {
		t.Fatal(err)
	}
	clientCreds, err := NewCredentials(Config{Attester: attester})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	serverDone := make(chan error, 1)
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			serverDone <- err
			return
		}
		c, _, err := serverCreds.ServerHandshake(conn)
		if c != nil {
			_ = c.Close()
		}
		serverDone <- err
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	raw, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, _, clientErr := clientCreds.ClientHandshake(ctx, "", raw)
	if c != nil {
		_ = c.Close()
	}
	return <-serverDone, clientErr
}

// TestKeyActivationRefusals: an AK not resident with the EK whose
// certificate the evidence carries, and a replayed answer, are refused
// inside the handshake, with their reasons, on both sides.
func TestKeyActivationRefusals(t *testing.T) {
	ca := swtpmtest.CA(t)
	roots, inter := swtpmtest.Pools(t, ca)
	node := swtpmtest.Manufacture(t, ca, pcrs, nil)
	stranger := swtpmtest.Manufacture(t, ca, pcrs, nil)
	verifier, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: pcrs, Endorsement: tpm.Endorsement{EKRoots: roots, EKIntermediates: inter}}, time.Now)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("AK not resident with the EK", func(t *testing.T) {
		serverErr, clientErr := clientAttests(t, swtpmtest.SwappedEK{QuoteAttester: stranger.Attester, EKCertificate: node.Attester.EKCertificate()}, verifier)
		if !errors.Is(serverErr, attestation.ErrActivation) || !strings.Contains(serverErr.Error(), "not resident in the TPM") {
			t.Errorf("server: %v, want ErrActivation naming the AK not resident with the EK", serverErr)
		}
		if !errors.Is(clientErr, attestation.ErrActivation) || !strings.Contains(clientErr.Error(), "cannot answer") {
			t.Errorf("client: %v, want ErrActivation saying it cannot answer", clientErr)
		}
	})

	t.Run("replayed answer", func(t *testing.T) {
		r := &swtpmtest.Replaying{QuoteAttester: node.Attester}
		if serverErr, clientErr := clientAttests(t, r, verifier); serverErr != nil || clientErr != nil {
			t.Fatalf("first handshake: server %v, client %v; want success", serverErr, clientErr)
		}
		serverErr, clientErr := clientAttests(t, r, verifier)
		if !errors.Is(serverErr, attestation.ErrActivation) || !strings.Contains(serverErr.Error(), "replayed") {
			t.Errorf("server: %v, want ErrActivation naming a replayed answer", serverErr)
		}
		if !errors.Is(clientErr, attestation.ErrActivation) || !strings.Contains(clientErr.Error(), "the verifier refused") {
			t.Errorf("client: %v, want the verifier's refusal", clientErr)
		}
	})
}

// TestActivationFrames: frames round-trip, and a length over the bound
// is refused before anything is allocated for it.
func TestActivationFrames(t *testing.T) {
	var buf strings.Builder
	if err := writeFrame(&buf, []byte("challenge")); err != nil {
		t.Fatal(err)
	}
	got, err := readFrame(strings.NewReader(buf.String()))
	if err != nil || string(got) != "challenge" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	if err := writeFrame(&buf, make([]byte, attestation.MaxActivationSize+1)); err == nil {
		t.Fatal("wrote an oversized frame")
	}
	if _, err := readFrame(strings.NewReader("\xff\xff\xff\xff")); !errors.Is(err, attestation.ErrMalformed) {
		t.Fatalf("oversized length: %v, want ErrMalformed", err)
	}
	if _, err := readFrame(strings.NewReader("\x00\x00\x00\x09short")); err == nil {
		t.Fatal("a truncated frame was read")
	}
}

// FuzzReadFrame: a peer's activation frame never panics the reader nor
// makes it allocate beyond the bound.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte("\x00\x00\x00\x03abc"))
	f.Add([]byte("\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		payload, err := readFrame(strings.NewReader(string(data)))
		if err == nil && len(payload) > attestation.MaxActivationSize {
			t.Fatalf("read %d bytes", len(payload))
		}
	})
}
