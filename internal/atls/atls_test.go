package atls

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

var pcrs = []int{0, 4, 16}

// tpmPair is an attester on the in-process TPM simulator and a verifier
// pinning its key. The simulator is one per process, so both sides of a
// mutual handshake share the attester (it serialises TPM commands).
type tpmPair struct {
	attester *tpmattester.QuoteAttester
	verifier *tpm.QuoteVerifier
}

func newTPMPair(t testing.TB) *tpmPair {
	t.Helper()
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	boot := []tpm.Artefact{tpm.BytesArtefact(4, "bootstrapper", []byte("v1"))}
	log, err := tpmattester.MeasureBoot(sim, boot)
	if err != nil {
		t.Fatal(err)
	}
	a, err := tpmattester.New(sim, tpmattester.Options{PCRs: pcrs, EventLog: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	ref, err := tpm.ReferenceValues(boot, pcrs)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{
		PCRs: pcrs, ReferenceValues: ref,
		Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{a.AttestationKey()}},
	}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return &tpmPair{attester: a, verifier: v}
}

// serveHealth serves the gRPC health service with creds on loopback and
// records the AuthInfo of each call.
func serveHealth(t *testing.T, creds *Credentials) (addr string, seen func() []AuthInfo) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var infos []AuthInfo
	srv := grpc.NewServer(grpc.Creds(creds), grpc.UnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if p, ok := peer.FromContext(ctx); ok {
				if info, ok := p.AuthInfo.(AuthInfo); ok {
					mu.Lock()
					infos = append(infos, info)
					mu.Unlock()
				}
			}
			return handler(ctx, req)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), func() []AuthInfo {
		mu.Lock()
		defer mu.Unlock()
		return append([]AuthInfo(nil), infos...)
	}
}

func TestModesOverGRPC(t *testing.T) {
	pair := newTPMPair(t)
	attests := Config{Attester: pair.attester}
	verifies := Config{Verifiers: []attestation.Verifier{pair.verifier}}
	both := Config{Attester: pair.attester, Verifiers: []attestation.Verifier{pair.verifier}}
	tests := []struct {
		name                   string
		server, client         Config
		serverSees, clientSees bool
	}{
		{name: "server attests", server: attests, client: verifies, clientSees: true},
		{name: "client attests", server: verifies, client: attests, serverSees: true},
		{name: "mutual", server: both, client: both, serverSees: true, clientSees: true},
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
				t.Fatalf("health check over attested TLS: %v", err)
			}
			clientInfo, ok := p.AuthInfo.(AuthInfo)
			if !ok {
				t.Fatalf("client AuthInfo is %T", p.AuthInfo)
			}
			if got := clientInfo.Peer != nil; got != tt.clientSees {
				t.Errorf("client has verified server: %t, want %t", got, tt.clientSees)
			}
			infos := seen()
			if len(infos) != 1 {
				t.Fatalf("server saw %d calls", len(infos))
			}
			if got := infos[0].Peer != nil; got != tt.serverSees {
				t.Errorf("server has verified client: %t, want %t", got, tt.serverSees)
			}
			for _, r := range []*attestation.Result{clientInfo.Peer, infos[0].Peer} {
				if r != nil && (r.Variant != attestation.VariantTPM || !strings.HasPrefix(r.Identity, "tpm-ak:")) {
					t.Errorf("result %+v", r)
				}
			}
		})
	}
}

func TestEveryHandshakeHasFreshKeyAndEvidence(t *testing.T) {
	pair := newTPMPair(t)
	server := Config{Attester: pair.attester}
	client := Config{Verifiers: []attestation.Verifier{pair.verifier}}
	keys := map[string]bool{}
	for range 3 {
		state, _, err := handshakePair(t, server, client, nil)
		if err != nil {
			t.Fatal(err)
		}
		spki := string(state.PeerCertificates[0].RawSubjectPublicKeyInfo)
		if keys[spki] {
			t.Fatal("a server key was used for two handshakes")
		}
		keys[spki] = true
	}
}

// handshakePair runs one TLS handshake between server and client over a
// pipe. When serverCert is set, the server presents it instead of its own
// attested certificate. It returns the client's connection state and the
// server's and client's errors.
func handshakePair(t *testing.T, server, client Config, serverCert *tls.Certificate) (tls.ConnectionState, error, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sc, _, err := serverConfig(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	if serverCert != nil {
		sc.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serverCert, nil }
	}
	cc, _, err := clientConfig(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	serverErr := make(chan error, 1)
	go func() {
		conn := tls.Server(a, sc)
		err := conn.HandshakeContext(ctx)
		if err == nil {
			// Read until the client closes, so the client can finish its handshake.
			_, _ = conn.Read(make([]byte, 1))
		}
		serverErr <- err
		_ = a.Close()
	}()
	conn := tls.Client(b, cc)
	clientErr := conn.HandshakeContext(ctx)
	state := conn.ConnectionState()
	_ = conn.Close()
	_ = b.Close()
	return state, <-serverErr, clientErr
}

// selfSigned makes a certificate with the given extensions, self-signed
// unless issuerKey is set, valid during [notBefore, notAfter].
func selfSigned(t *testing.T, key *ecdsa.PrivateKey, exts []pkix.Extension, issuerKey *ecdsa.PrivateKey, notBefore, notAfter time.Time) *tls.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "gatehouse-atls"},
		NotBefore: notBefore, NotAfter: notAfter, ExtraExtensions: exts,
	}
	parent, signer := tmpl, key
	if issuerKey != nil {
		parent = &x509.Certificate{SerialNumber: big.NewInt(8), Subject: pkix.Name{CommonName: "some CA"}}
		signer = issuerKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func evidenceExtension(t *testing.T, variant attestation.Variant, evidence []byte) pkix.Extension {
	t.Helper()
	oid, err := variant.OID()
	if err != nil {
		t.Fatal(err)
	}
	value, err := asn1.Marshal(evidence)
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: oid, Value: value}
}

// TestHandshakeRejects is the negative suite at the certificate level: a
// client that verifies a server presenting a bad certificate.
func TestHandshakeRejects(t *testing.T) {
	pair := newTPMPair(t)
	client := Config{Verifiers: []attestation.Verifier{pair.verifier}}
	now := time.Now()
	key := newKey(t)
	tpmOID, _ := attestation.VariantTPM.OID()
	// Evidence for key, bound to an unrelated nonce (from an earlier handshake).
	spki, _ := x509.MarshalPKIXPublicKey(key.Public())
	keyHash := sha256.Sum256(spki)
	oldNonce := make([]byte, attestation.NonceSize)
	staleEvidence, err := pair.attester.Attest(t.Context(), keyHash[:], oldNonce)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		cert     *tls.Certificate
		wantErr  error
		wantText string
	}{
		{
			name:    "missing evidence extension",
			cert:    selfSigned(t, key, nil, nil, now.Add(-time.Minute), now.Add(time.Minute)),
			wantErr: ErrNoEvidence,
		},
		{
			name:     "unknown OID in the Gatehouse arc",
			cert:     selfSigned(t, key, []pkix.Extension{{Id: append(append(asn1.ObjectIdentifier{}, tpmOID[:len(tpmOID)-1]...), 99), Value: []byte{4, 0}}}, nil, now.Add(-time.Minute), now.Add(time.Minute)),
			wantErr:  ErrUnknownVariant,
			wantText: "unknown OID 1.3.9903.1.99",
		},
		{
			name:     "variant without a verifier on this side",
			cert:     selfSigned(t, key, []pkix.Extension{evidenceExtension(t, attestation.VariantSNP, []byte("report"))}, nil, now.Add(-time.Minute), now.Add(time.Minute)),
			wantErr:  ErrUnknownVariant,
			wantText: "sev-snp",
		},
		{
			name:    "truncated evidence extension",
			cert:    selfSigned(t, key, []pkix.Extension{{Id: tpmOID, Value: []byte{4, 0x82, 0x10, 0x00, 1, 2}}}, nil, now.Add(-time.Minute), now.Add(time.Minute)),
			wantErr: attestation.ErrMalformed,
		},
		{
			name:     "oversized evidence extension",
			cert:     selfSigned(t, key, []pkix.Extension{evidenceExtension(t, attestation.VariantTPM, make([]byte, attestation.MaxEvidenceSize+1))}, nil, now.Add(-time.Minute), now.Add(time.Minute)),
			wantErr:  attestation.ErrMalformed,
			wantText: "extension has",
		},
		{
			name:    "certificate not self-signed",
			cert:    selfSigned(t, key, []pkix.Extension{evidenceExtension(t, attestation.VariantTPM, staleEvidence)}, newKey(t), now.Add(-time.Minute), now.Add(time.Minute)),
			wantErr: ErrNotSelfSigned,
		},
		{
			name:    "expired certificate",
			cert:    selfSigned(t, key, []pkix.Extension{evidenceExtension(t, attestation.VariantTPM, staleEvidence)}, nil, now.Add(-time.Hour), now.Add(-time.Minute)),
			wantErr: ErrCertExpired,
		},
		{
			name:    "replayed evidence from an earlier handshake",
			cert:    selfSigned(t, key, []pkix.Extension{evidenceExtension(t, attestation.VariantTPM, staleEvidence)}, nil, now.Add(-time.Minute), now.Add(time.Minute)),
			wantErr: attestation.ErrNonce,
		},
		{
			name:    "garbage evidence",
			cert:    selfSigned(t, key, []pkix.Extension{evidenceExtension(t, attestation.VariantTPM, []byte("not evidence"))}, nil, now.Add(-time.Minute), now.Add(time.Minute)),
			wantErr: attestation.ErrMalformed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, clientErr := handshakePair(t, Config{Attester: pair.attester}, client, tt.cert)
			if !errors.Is(clientErr, tt.wantErr) {
				t.Fatalf("client error = %v, want %v", clientErr, tt.wantErr)
			}
			if tt.wantText != "" && !strings.Contains(clientErr.Error(), tt.wantText) {
				t.Fatalf("client error = %v, want it to contain %q", clientErr, tt.wantText)
			}
		})
	}
}

// TestEvidenceBoundToAnotherKey presents fresh, correctly nonce-bound
// evidence that was made for a different TLS key.
func TestEvidenceBoundToAnotherKey(t *testing.T) {
	pair := newTPMPair(t)
	other := newKey(t)
	otherSPKI, _ := x509.MarshalPKIXPublicKey(other.Public())
	otherHash := sha256.Sum256(otherSPKI)
	thief := Config{Attester: relay{pair.attester, otherHash[:]}}
	_, _, clientErr := handshakePair(t, thief, Config{Verifiers: []attestation.Verifier{pair.verifier}}, nil)
	if !errors.Is(clientErr, ErrKeyBinding) {
		t.Fatalf("client error = %v, want %v", clientErr, ErrKeyBinding)
	}
}

// relay is an attester that binds evidence to fixed user data instead of
// the key it is asked about, as an attacker relaying a genuine attester's
// evidence onto its own key would.
type relay struct {
	*tpmattester.QuoteAttester
	userData []byte
}

func (r relay) Attest(ctx context.Context, _, nonce []byte) ([]byte, error) {
	return r.QuoteAttester.Attest(ctx, r.userData, nonce)
}

// panicking is a verifier with a parser bug: it panics on any evidence.
type panicking struct{ attestation.Verifier }

func (panicking) Verify(context.Context, []byte, []byte) (*attestation.Result, error) {
	panic("slice bounds out of range")
}

// TestVerifierPanicRefusesThePeer: a verifier that panics on a peer's
// evidence refuses that peer as malformed evidence; the process lives on.
func TestVerifierPanicRefusesThePeer(t *testing.T) {
	pair := newTPMPair(t)
	_, _, clientErr := handshakePair(t, Config{Attester: pair.attester}, Config{Verifiers: []attestation.Verifier{panicking{pair.verifier}}}, nil)
	if !errors.Is(clientErr, attestation.ErrMalformed) || !strings.Contains(clientErr.Error(), "verifier failed on this evidence") {
		t.Fatalf("client error = %v, want malformed evidence", clientErr)
	}
}

func TestModeMismatches(t *testing.T) {
	pair := newTPMPair(t)
	tests := []struct {
		name          string
		server        Config
		client        Config
		wantServerErr error
		wantClientErr error
	}{
		{
			name:   "server attests but the client sends no nonce",
			server: Config{Attester: pair.attester}, client: Config{Attester: pair.attester},
			wantServerErr: ErrNoNonce,
		},
		{
			name:   "client expects the server to attest but it does not",
			server: Config{Verifiers: []attestation.Verifier{pair.verifier}}, client: Config{Verifiers: []attestation.Verifier{pair.verifier}},
			wantClientErr: ErrNoEvidence,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, serverErr, clientErr := handshakePair(t, tt.server, tt.client, nil)
			if serverErr == nil && clientErr == nil {
				t.Fatal("handshake succeeded")
			}
			if tt.wantServerErr != nil && !errors.Is(serverErr, tt.wantServerErr) {
				t.Fatalf("server error = %v, want %v", serverErr, tt.wantServerErr)
			}
			if tt.wantClientErr != nil && !errors.Is(clientErr, tt.wantClientErr) {
				t.Fatalf("client error = %v, want %v", clientErr, tt.wantClientErr)
			}
		})
	}
}

func TestConfigChecks(t *testing.T) {
	if _, err := NewCredentials(Config{}); err == nil || !strings.Contains(err.Error(), "neither attests nor verifies") {
		t.Fatalf("error = %v", err)
	}
}

// TestFixedCertificateAndVerifyPeer covers the join service's mode: the
// server presents a fixed certificate that the client checks with VerifyPeer
// (a pinned identity), while the client attests to the server.
func TestFixedCertificateAndVerifyPeer(t *testing.T) {
	pair := newTPMPair(t)
	now := time.Now()
	fixed := selfSigned(t, newKey(t), nil, nil, now.Add(-time.Minute), now.Add(time.Hour))
	other := selfSigned(t, newKey(t), nil, nil, now.Add(-time.Minute), now.Add(time.Hour))
	pin := func(chain []*x509.Certificate) error {
		if !bytes.Equal(chain[0].Raw, fixed.Certificate[0]) {
			return errors.New("not the pinned certificate")
		}
		return nil
	}
	client, err := NewCredentials(Config{Attester: pair.attester, VerifyPeer: pin})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cert    *tls.Certificate
		wantErr string
	}{
		{name: "pinned server", cert: fixed},
		{name: "impostor", cert: other, wantErr: "peer certificate rejected: not the pinned certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server, err := NewCredentials(Config{
				Verifiers:   []attestation.Verifier{pair.verifier},
				Certificate: func() (*tls.Certificate, error) { return tt.cert, nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			addr, seen := serveHealth(t, server)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(client))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if infos := seen(); len(infos) != 1 || infos[0].Peer == nil {
				t.Fatalf("server did not verify the client: %+v", infos)
			}
		})
	}
	if _, err := NewCredentials(Config{Attester: pair.attester, Certificate: func() (*tls.Certificate, error) { return fixed, nil }}); err == nil {
		t.Fatal("a config that attests and presents a fixed certificate was accepted")
	}
}
