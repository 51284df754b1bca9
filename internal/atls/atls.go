// Package atls is attested TLS: TLS 1.3 in which a peer proves by remote
// attestation what it runs. The attesting peer makes a fresh key and a
// self-signed certificate for every handshake, and puts evidence into a
// non-critical X.509 extension of it (one OID per attestation variant, see
// attestation.Variant.OID). The evidence is bound to the certificate's public
// key (user data = SHA-256 of its SubjectPublicKeyInfo) and to a fresh nonce
// of the verifying peer, so it can be neither replayed nor moved to another
// key.
//
// How the nonce reaches the attester:
//
//   - A verifying client sends its nonce in the ClientHello as an extra ALPN
//     protocol, "gatehouse-atls-nonce-<hex>", next to "h2". ALPN is an
//     ordinary, integrity-protected ClientHello field that Go servers expose
//     before choosing a certificate (tls.ClientHelloInfo.SupportedProtos);
//     unlike SNI (Constellation's choice) it is not a host name, so it needs no
//     DNS-label tricks and leaves SNI free for routing.
//   - A verifying server sends its nonce in the CertificateRequest as the only
//     entry of certificate_authorities (RFC 8446 §4.2.4): a distinguished name
//     "CN=gatehouse-atls-nonce-<hex>", which Go clients see before choosing a
//     certificate (tls.CertificateRequestInfo.AcceptableCAs). It is the one
//     server-to-client field available before the client's certificate.
//
// Both are covered by the TLS 1.3 transcript, so a man in the middle cannot
// change them without breaking the handshake.
//
// # The evidence endpoint
//
// A node's evidence endpoint (EvidenceEndpoint, EvidenceFetcher) does not
// use the attested handshake, because in TLS 1.3 the server sends its
// Certificate, which carries the quote, before it sees the client's: an
// attested server cannot authenticate its client before quoting. On one
// TCP connection:
//
//  1. The door: a TLS 1.3 handshake with ALPN evidenceProtocol
//     ("gatehouse-evidence/2"). The server presents a self-signed Ed25519
//     certificate that proves nothing (the client does not check it). Once
//     the node has its cluster's CA file, the server requests a client
//     certificate and accepts only one chained to that CA for client
//     authentication whose subject organization is allowed
//     (DefaultVerifierOrganizations); before it has one, no certificate is
//     asked for. A refused client reads the TLS alert the server sent
//     (ErrRefused); the client sends nothing after its Finished, so a
//     refusal is never lost to a reset.
//  2. Once it accepted the client, the server quotes with the connection's
//     exporter value (RFC 8446 §7.5, label "EXPORTER-gatehouse-evidence",
//     32 bytes; RFC 9266's tls-exporter channel binding) as the nonce and
//     a fixed domain separator as user data, and sends two frames (4-byte
//     big-endian length, payload): the variant's name and the evidence.
//     The exporter covers the client's random and key share, so the
//     evidence is fresh, and a man in the middle, who has a different
//     exporter on each side, cannot relay it.
//  3. The key activation exchange, over the same connection.
//
// One handshake and one quote per fetch: the evidence needs no second,
// attested handshake of its own.
//
// The client's first ClientHello also carries the attested handshake's
// "h2" and nonce protocols: a node from before the door answers it as
// its attested handshake (ALPN "h2"), and the client verifies that
// handshake's evidence instead, so verifiers can be upgraded before nodes.
// A client from before the door (no evidenceProtocol) is answered only
// while the node has no cluster CA. Connection limits apply at accept and
// quotes pass a bounded queue that honours each connection's deadline, so
// no caller can make the node quote more than one quote at a time, nor
// more than a few wait (docs/continuous-attestation.md, "The evidence
// endpoint's door").
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
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// noncePrefix prefixes a nonce in ALPN and in the acceptable-CA name.
const noncePrefix = "gatehouse-atls-nonce-"

// certValidity is how long an attested certificate is valid; it lives for
// one handshake, the margin absorbs clock skew between the peers.
const certValidity = 10 * time.Minute

// Config is one side's part in attested TLS. A side with an Attester
// attests; a side with Verifiers requires its peer to attest with one of
// their variants. The three modes: server attests (server has an Attester,
// client has Verifiers), client attests (the reverse), mutual (both have both).
type Config struct {
	// Attester attests this side; nil if it does not attest.
	Attester attestation.Attester
	// Verifiers appraise the peer's evidence, one per accepted variant;
	// empty if the peer need not attest.
	Verifiers []attestation.Verifier
	// Certificate, when set, gives the certificate a side that does not
	// attest presents (for example the join service's cluster identity, a
	// chain to the cluster CA); nil means a fresh self-signed certificate. It
	// is called once per handshake, so it may rotate certificates.
	Certificate func() (*tls.Certificate, error)
	// VerifyPeer, when set, checks the peer's certificate chain as sent, leaf
	// first, on every handshake. It complements or replaces attestation: a
	// side with VerifyPeer and no Verifiers trusts its peer by certificate
	// alone (for example a pinned cluster CA).
	VerifyPeer func(chain []*x509.Certificate) error
	// Now is the clock certificates are made and checked with; nil is time.Now.
	Now func() time.Time
}

// Errors of the handshake checks, for errors.Is; the attestation package's
// errors describe failures of the evidence itself.
var (
	ErrNoCertificate   = errors.New("atls: peer sent no certificate")
	ErrNotSelfSigned   = errors.New("atls: peer certificate is not self-signed")
	ErrCertExpired     = errors.New("atls: peer certificate is outside its validity period")
	ErrNoEvidence      = errors.New("atls: peer certificate carries no evidence extension")
	ErrUnknownVariant  = errors.New("atls: peer evidence is of a variant this side does not accept")
	ErrKeyBinding      = errors.New("atls: peer evidence is bound to another key")
	ErrNoNonce         = errors.New("atls: peer sent no attestation nonce")
	errEvidenceInvalid = errors.New("atls: peer evidence does not verify")
	errPeerRejected    = errors.New("atls: peer certificate rejected")
)

func (c *Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Config) check() error {
	if c.Attester == nil && len(c.Verifiers) == 0 && c.VerifyPeer == nil {
		return errors.New("atls: config neither attests nor verifies; use plain TLS instead")
	}
	if c.Attester != nil && c.Certificate != nil {
		return errors.New("atls: config both attests and presents a fixed certificate; choose one")
	}
	seen := map[attestation.Variant]bool{}
	for _, v := range c.Verifiers {
		if _, err := v.Variant().OID(); err != nil {
			return err
		}
		if seen[v.Variant()] {
			return fmt.Errorf("atls: two verifiers for variant %s", v.Variant())
		}
		seen[v.Variant()] = true
	}
	if c.Attester != nil {
		if _, err := c.Attester.Variant().OID(); err != nil {
			return err
		}
	}
	return nil
}

// peerEvidence holds what the peer's evidence proved, once the handshake is done.
type peerEvidence struct {
	mu       sync.Mutex
	result   *attestation.Result
	evidence Evidence
	// didAttest records that this side attested to its peer in the handshake.
	didAttest bool
}

// Evidence is the peer's evidence as verified, with the nonce it was bound
// to, kept so a relying party can appraise it again when its policy
// changes during the connection's life. Its Data holds no secret.
type Evidence struct {
	Data  []byte
	Nonce []byte
}

// Evidence returns the peer's verified evidence and nonce; zero when the
// peer was not asked to attest or the handshake has not completed.
func (v *peerEvidence) Evidence() Evidence {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.evidence
}

// Result returns the peer's verified attestation result, or nil when the
// peer was not asked to attest or the handshake has not completed.
func (v *peerEvidence) Result() *attestation.Result {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.result
}

func (v *peerEvidence) markAttested() {
	v.mu.Lock()
	v.didAttest = true
	v.mu.Unlock()
}

func (v *peerEvidence) attested() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.didAttest
}

func (v *peerEvidence) set(r *attestation.Result, e Evidence) {
	v.mu.Lock()
	v.result, v.evidence = r, e
	v.mu.Unlock()
}

// clientConfig returns a TLS configuration for one client handshake (a fresh
// nonce each time: never reuse it) and where the server's verified result
// will be. The handshake is complete only after the key activation
// exchange that NewCredentials, ServeEvidence and FetchEvidence run after
// crypto/tls's handshake; until then a result may carry a KeyActivation
// that nobody answered.
func clientConfig(ctx context.Context, c Config) (*tls.Config, *peerEvidence, error) {
	if err := c.check(); err != nil {
		return nil, nil, err
	}
	verified := &peerEvidence{}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		// Evidence is fresh per handshake; a resumed session would skip it.
		SessionTicketsDisabled: true,
		// The server's certificate is checked by VerifyConnection below: it
		// is self-signed by design and trusted through its evidence.
		InsecureSkipVerify: true, //nolint:gosec // verified by attestation in VerifyConnection
	}
	if len(c.Verifiers) > 0 {
		nonce, err := newNonce()
		if err != nil {
			return nil, nil, err
		}
		cfg.NextProtos = append(cfg.NextProtos, noncePrefix+hex.EncodeToString(nonce))
		cfg.VerifyConnection = verifyConnection(ctx, &c, nonce, verified)
	} else if c.VerifyPeer != nil {
		cfg.VerifyConnection = verifyConnection(ctx, &c, nil, verified)
	}
	if c.Attester != nil {
		cfg.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			nonce, err := nonceFromAcceptableCAs(cri.AcceptableCAs)
			if err != nil {
				return nil, err
			}
			verified.markAttested()
			return c.attestedCertificate(ctx, nonce)
		}
	} else if c.Certificate != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.Certificate()
		}
	}
	return cfg, verified, nil
}

// serverConfig returns a TLS configuration for one server handshake (a fresh
// nonce each time: never reuse it) and where the client's verified result
// will be. As with clientConfig, the key activation exchange follows.
func serverConfig(ctx context.Context, c Config) (*tls.Config, *peerEvidence, error) {
	if err := c.check(); err != nil {
		return nil, nil, err
	}
	verified := &peerEvidence{}
	cfg := &tls.Config{
		MinVersion:             tls.VersionTLS13,
		NextProtos:             []string{"h2"},
		SessionTicketsDisabled: true, // evidence is fresh per handshake; a resumed session would skip it
	}
	cfg.GetCertificate = func(chi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if c.Certificate != nil {
			return c.Certificate()
		}
		if c.Attester == nil {
			// The client does not verify the server by attestation; it still
			// needs a certificate for the handshake.
			return c.certificate(nil)
		}
		nonce, err := nonceFromALPN(chi.SupportedProtos)
		if err != nil {
			return nil, err
		}
		verified.markAttested()
		return c.attestedCertificate(ctx, nonce)
	}
	if len(c.Verifiers) > 0 {
		nonce, err := newNonce()
		if err != nil {
			return nil, nil, err
		}
		pool, err := nonceCertPool(nonce)
		if err != nil {
			return nil, nil, err
		}
		// Request, not require: VerifyConnection then refuses a client
		// without a certificate with ErrNoCertificate, a precise reason.
		cfg.ClientAuth = tls.RequestClientCert
		cfg.ClientCAs = pool
		cfg.VerifyConnection = verifyConnection(ctx, &c, nonce, verified)
	} else if c.VerifyPeer != nil {
		cfg.ClientAuth = tls.RequestClientCert
		cfg.VerifyConnection = verifyConnection(ctx, &c, nil, verified)
	}
	return cfg, verified, nil
}

// verifyConnection returns a tls.Config.VerifyConnection that verifies the
// peer's evidence against nonce (when c has Verifiers) and its certificate
// chain (when c has VerifyPeer), and records the attestation result.
// VerifyConnection, unlike VerifyPeerCertificate, runs on every handshake,
// resumed or not.
func verifyConnection(ctx context.Context, c *Config, nonce []byte, verified *peerEvidence) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return ErrNoCertificate
		}
		if c.VerifyPeer != nil {
			if err := c.VerifyPeer(cs.PeerCertificates); err != nil {
				return fmt.Errorf("%w: %w", errPeerRejected, err)
			}
		}
		if len(c.Verifiers) == 0 {
			return nil
		}
		// crypto/tls has parsed the certificate already; do not parse it again.
		result, evidence, err := c.verifyPeer(ctx, cs.PeerCertificates[0], nonce)
		if err != nil {
			return err
		}
		verified.set(result, Evidence{Data: evidence, Nonce: nonce})
		return nil
	}
}

func newNonce() ([]byte, error) {
	nonce := make([]byte, attestation.NonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("atls: generating nonce: %w", err)
	}
	return nonce, nil
}

func decodeNonce(s string) ([]byte, bool) {
	if !strings.HasPrefix(s, noncePrefix) {
		return nil, false
	}
	nonce, err := hex.DecodeString(strings.TrimPrefix(s, noncePrefix))
	if err != nil || len(nonce) != attestation.NonceSize {
		return nil, false
	}
	return nonce, true
}

func nonceFromALPN(protos []string) ([]byte, error) {
	for _, p := range protos {
		if nonce, ok := decodeNonce(p); ok {
			return nonce, nil
		}
	}
	return nil, fmt.Errorf("%w: no %s<hex> ALPN protocol in the ClientHello", ErrNoNonce, noncePrefix)
}

// nonceCertPool returns a pool whose only subject is CN=<prefix><hex nonce>;
// crypto/tls sends the pool's subjects as certificate_authorities.
func nonceCertPool(nonce []byte) (*x509.CertPool, error) {
	name := pkix.Name{CommonName: noncePrefix + hex.EncodeToString(nonce)}
	der, err := asn1.Marshal(name.ToRDNSequence())
	if err != nil {
		return nil, fmt.Errorf("atls: encoding nonce name: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(&x509.Certificate{Raw: der, RawSubject: der})
	return pool, nil
}

func nonceFromAcceptableCAs(names [][]byte) ([]byte, error) {
	for _, der := range names {
		var rdn pkix.RDNSequence
		if rest, err := asn1.Unmarshal(der, &rdn); err != nil || len(rest) != 0 {
			continue
		}
		var name pkix.Name
		name.FillFromRDNSequence(&rdn)
		if nonce, ok := decodeNonce(name.CommonName); ok {
			return nonce, nil
		}
	}
	return nil, fmt.Errorf("%w: no CN=%s<hex> in the CertificateRequest's acceptable CAs", ErrNoNonce, noncePrefix)
}

// attestedCertificate makes a fresh key and a self-signed certificate whose
// evidence extension binds the key and nonce.
func (c *Config) attestedCertificate(ctx context.Context, nonce []byte) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("atls: generating key: %w", err)
	}
	spki, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, fmt.Errorf("atls: encoding public key: %w", err)
	}
	userData := sha256.Sum256(spki)
	evidence, err := c.Attester.Attest(ctx, userData[:], nonce)
	if err != nil {
		return nil, fmt.Errorf("atls: attesting: %w", err)
	}
	oid, err := c.Attester.Variant().OID()
	if err != nil {
		return nil, err
	}
	value, err := asn1.Marshal(evidence) // an OCTET STRING, so the extension value is DER
	if err != nil {
		return nil, fmt.Errorf("atls: encoding evidence: %w", err)
	}
	return c.certificate(&keyAndExtension{key: key, ext: pkix.Extension{Id: oid, Value: value}})
}

type keyAndExtension struct {
	key *ecdsa.PrivateKey
	ext pkix.Extension
}

// certificate self-signs a certificate for ke's key with its extension, or
// for a fresh key without one when ke is nil.
func (c *Config) certificate(ke *keyAndExtension) (*tls.Certificate, error) {
	if ke == nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("atls: generating key: %w", err)
		}
		ke = &keyAndExtension{key: key}
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("atls: generating serial: %w", err)
	}
	now := c.now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "gatehouse-atls"},
		NotBefore:    now.Add(-certValidity),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if ke.ext.Id != nil {
		tmpl.ExtraExtensions = []pkix.Extension{ke.ext}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, ke.key.Public(), ke.key)
	if err != nil {
		return nil, fmt.Errorf("atls: self-signing certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: crypto.Signer(ke.key)}, nil
}

// verifyPeer checks the peer's certificate and evidence against nonce.
func (c *Config) verifyPeer(ctx context.Context, cert *x509.Certificate, nonce []byte) (*attestation.Result, []byte, error) {
	if !bytes.Equal(cert.RawIssuer, cert.RawSubject) ||
		cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature) != nil {
		return nil, nil, ErrNotSelfSigned
	}
	if now := c.now(); now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, nil, fmt.Errorf("%w: valid %s to %s", ErrCertExpired, cert.NotBefore.Format(time.RFC3339), cert.NotAfter.Format(time.RFC3339))
	}
	v, evidence, err := c.findEvidence(cert)
	if err != nil {
		return nil, nil, err
	}
	result, err := verifyRecovering(ctx, v, evidence, nonce)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errEvidenceInvalid, err)
	}
	spkiHash := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	if !bytes.Equal(result.UserData, spkiHash[:]) {
		return nil, nil, ErrKeyBinding
	}
	return result, evidence, nil
}

// verifyRecovering runs v on a peer's evidence; a panic in the verifier
// (a parser bug in it or a library it uses, on bytes the peer chose)
// becomes an error wrapping attestation.ErrMalformed, so a peer cannot
// crash the process with its evidence. Verifiers' own fuzz targets call
// them directly and still see such panics.
func verifyRecovering(ctx context.Context, v attestation.Verifier, evidence, nonce []byte) (result *attestation.Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			result, err = nil, fmt.Errorf("%w: the %s verifier failed on this evidence: %v", attestation.ErrMalformed, v.Variant(), r)
		}
	}()
	return v.Verify(ctx, evidence, nonce)
}

// findEvidence returns the verifier for the certificate's evidence extension
// and the evidence.
func (c *Config) findEvidence(cert *x509.Certificate) (attestation.Verifier, []byte, error) {
	var unknown []string
	for _, ext := range cert.Extensions {
		variant, ok := attestation.VariantForOID(ext.Id)
		if !ok {
			if attestation.InArc(ext.Id) {
				unknown = append(unknown, "unknown OID "+ext.Id.String())
			}
			continue
		}
		i := slices.IndexFunc(c.Verifiers, func(v attestation.Verifier) bool { return v.Variant() == variant })
		if i < 0 {
			unknown = append(unknown, string(variant))
			continue
		}
		// An OCTET STRING header takes at most 6 bytes for these sizes.
		if len(ext.Value) > attestation.MaxEvidenceSize+6 {
			return nil, nil, fmt.Errorf("%w: %w: evidence extension has %d bytes, at most %d allowed",
				errEvidenceInvalid, attestation.ErrMalformed, len(ext.Value), attestation.MaxEvidenceSize)
		}
		var evidence []byte
		if rest, err := asn1.Unmarshal(ext.Value, &evidence); err != nil || len(rest) != 0 {
			return nil, nil, fmt.Errorf("%w: %w: evidence extension is not one DER OCTET STRING", errEvidenceInvalid, attestation.ErrMalformed)
		}
		if len(evidence) > attestation.MaxEvidenceSize {
			return nil, nil, fmt.Errorf("%w: %w: evidence extension has %d bytes of evidence, at most %d allowed",
				errEvidenceInvalid, attestation.ErrMalformed, len(evidence), attestation.MaxEvidenceSize)
		}
		return c.Verifiers[i], evidence, nil
	}
	if len(unknown) > 0 {
		return nil, nil, fmt.Errorf("%w: peer attests with %s", ErrUnknownVariant, strings.Join(unknown, ", "))
	}
	return nil, nil, ErrNoEvidence
}
