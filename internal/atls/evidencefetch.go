package atls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// ErrRefused means a node's evidence endpoint refused the caller at its
// door: the node belongs to a cluster, and the caller presented no client
// certificate, or one the node does not answer.
var ErrRefused = errors.New("atls: the evidence endpoint refused this caller")

// EvidenceFetcher fetches nodes' evidence from their evidence endpoints
// (EvidenceEndpoint, `gatehouse-bootstrapper serve-evidence`). The zero
// value is an anonymous caller.
type EvidenceFetcher struct {
	// Certificate, when set, returns the client certificate (chain leaf
	// first, with its key) presented to a node that asks for one: a node
	// that belongs to a cluster answers certificates of the cluster CA in
	// one of DefaultVerifierOrganizations. It is called once per fetch,
	// before connecting, so it may renew certificates.
	Certificate func() (*tls.Certificate, error)
	// Timeout bounds one fetch when ctx's deadline is later; 0 is 30 s.
	Timeout time.Duration
	// Dialer connects to the node; nil is a zero net.Dialer.
	Dialer *net.Dialer
	// Sessions, when set, keeps the door's TLS 1.3 sessions (RFC 8446
	// §2.2), one per node address and client certificate, so the next
	// fetch from that node resumes: neither side's certificate is sent,
	// parsed or signed for again. The evidence is as fresh as on a full
	// handshake (it is bound to the new connection's exporter). A
	// tls.NewLRUClientSessionCache of DefaultEvidenceSessions; nil makes
	// every handshake a full one.
	Sessions tls.ClientSessionCache
	// Conns, when set, keeps each node's door connection open after a
	// fetch, so the next fetch asks again over it (a fresh nonce, one
	// quote, no handshake); nil closes every connection after its fetch.
	Conns *EvidenceConns
}

// FetchEvidence is EvidenceFetcher{}.Fetch: an anonymous caller.
func FetchEvidence(ctx context.Context, addr string, verifiers []attestation.Verifier) (*attestation.Result, error) {
	return EvidenceFetcher{}.Fetch(ctx, addr, verifiers)
}

// Fetch dials addr (host:port), passes the node's door, checks the
// evidence the node sends over the door's connection with verifiers
// against the connection's channel binding, and returns the verified
// result. A node from before the
// door (an attested handshake at once) is fetched from as well. Errors
// wrap ErrRefused when the node refused this caller, and otherwise say
// whether the node was unreachable or its evidence did not verify
// (wrapping the verifier's error).
func (f EvidenceFetcher) Fetch(ctx context.Context, addr string, verifiers []attestation.Verifier) (*attestation.Result, error) {
	timeout := f.Timeout
	if timeout <= 0 {
		timeout = handshakeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var cert *tls.Certificate
	if f.Certificate != nil {
		c, err := f.Certificate()
		if err != nil {
			return nil, fmt.Errorf("the client certificate: %w", err)
		}
		cert = c
	}
	var sessions tls.ClientSessionCache
	if f.Sessions != nil {
		sessions = newCertSessions(f.Sessions, cert)
	}
	key := certID(cert) + " " + addr
	if f.Conns != nil {
		if conn := f.Conns.take(key); conn != nil {
			r, err := again(ctx, conn, verifiers)
			if err == nil {
				f.Conns.put(key, conn)
				return r, nil
			}
			_ = conn.Close()
			if rejected(err) {
				return nil, fmt.Errorf("evidence from %s: %w", addr, err)
			}
			// The node closed the kept connection (idle, restarted, or it
			// no longer accepts the certificate): a new one says why.
		}
	}
	r, kept, resumed, err := f.fetch(ctx, addr, verifiers, cert, sessions, f.Conns != nil)
	if resumed && errors.Is(err, ErrRefused) {
		// The node judged the certificate of the session's first
		// handshake again and refused it (its CA changed): forget the
		// session and present the current certificate.
		r, kept, _, err = f.fetch(ctx, addr, verifiers, cert, nil, f.Conns != nil)
	}
	if kept != nil {
		f.Conns.put(key, kept)
	}
	return r, err
}

// again asks for fresh evidence over a kept door connection, within half
// the time ctx has left (the rest is for a new connection should the
// node have closed this one).
func again(ctx context.Context, conn *tls.Conn, verifiers []attestation.Verifier) (*attestation.Result, error) {
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok {
		deadline = time.Now().Add(time.Until(d) / 2)
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	request, err := newNonce()
	if err != nil {
		return nil, err
	}
	if err := writeFrameMax(conn, request, attestation.NonceSize); err != nil {
		return nil, err
	}
	nonce, err := channelNonce(conn.ConnectionState(), request)
	if err != nil {
		return nil, err
	}
	verified, err := verifyChannel(ctx, conn, nonce, verifiers)
	if err != nil {
		return nil, err
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return verified.Result(), nil
}

// rejected reports whether err is the node's evidence failing (its
// appraisal, IsRejection, or this package's checks around it), as opposed
// to the connection failing. The appraisal's other errors reach it wrapped
// in errEvidenceInvalid.
func rejected(err error) bool {
	for _, e := range []error{errEvidenceInvalid, ErrUnknownVariant, ErrKeyBinding} {
		if errors.Is(err, e) {
			return true
		}
	}
	return IsRejection(err)
}

// IsRejection reports whether err is evidence failing appraisal: it wraps
// one of attestation's errors (ErrMalformed, ErrNonce, ErrSignature,
// ErrUntrustedKey, ErrPolicy, ErrMeasurement, ErrActivation), as opposed
// to the node not answering.
func IsRejection(err error) bool {
	for _, e := range []error{attestation.ErrMalformed, attestation.ErrNonce, attestation.ErrSignature,
		attestation.ErrUntrustedKey, attestation.ErrPolicy, attestation.ErrMeasurement, attestation.ErrActivation} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// fetch is one connection of Fetch; resumed reports whether the door's
// session was resumed from sessions (nil: a full handshake). With keep,
// a door connection that served its evidence is returned open (kept),
// for the caller to ask again later; otherwise it is closed.
func (f EvidenceFetcher) fetch(ctx context.Context, addr string, verifiers []attestation.Verifier, cert *tls.Certificate,
	sessions tls.ClientSessionCache, keep bool) (_ *attestation.Result, kept *tls.Conn, resumed bool, _ error) {
	// The outer ClientHello is an attested one plus evidenceProtocol: a
	// node with a door chooses evidenceProtocol and ignores the nonce, a
	// node without one attests for the nonce in this very handshake.
	outerCfg, outerVerified, err := clientConfig(ctx, Config{Verifiers: verifiers})
	if err != nil {
		return nil, nil, false, err
	}
	outerCfg.NextProtos = append([]string{evidenceProtocol}, outerCfg.NextProtos...)
	outerCfg.CurvePreferences = doorCurves()
	if sessions != nil {
		// Only the door issues tickets: a node without it attests in
		// its handshake, which it never resumes, and a resumed session
		// offered as that handshake fails its evidence check.
		outerCfg.SessionTicketsDisabled, outerCfg.ClientSessionCache = false, sessions
	}
	verifyAttested := outerCfg.VerifyConnection
	outerCfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if cs.NegotiatedProtocol == evidenceProtocol {
			return nil // the door's certificate proves nothing; the evidence comes inside
		}
		return verifyAttested(cs)
	}
	outerCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if cert == nil {
			return &tls.Certificate{}, nil // none: the node refuses, and says so
		}
		return cert, nil
	}

	d := f.Dialer
	if d == nil {
		d = &net.Dialer{}
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, false, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	outer := tls.Client(conn, outerCfg)
	defer func() {
		if !stop() || kept == nil {
			kept = nil
			_ = conn.Close()
		}
	}()
	if err := outer.HandshakeContext(ctx); err != nil {
		return nil, nil, false, fmt.Errorf("attested TLS handshake with %s: %w", addr, err)
	}
	cs := outer.ConnectionState()
	if cs.NegotiatedProtocol != evidenceProtocol {
		r, err := finishFetch(ctx, addr, outer, outerVerified)
		return r, nil, false, err
	}
	// In TLS 1.3 the server judges the client's certificate after the
	// client's handshake ended, and the client sends nothing more: its
	// first read returns the evidence, or the alert of a refusal.
	nonce, err := channelNonce(cs, nil)
	if err != nil {
		return nil, nil, cs.DidResume, err
	}
	verified, err := verifyChannel(ctx, outer, nonce, verifiers)
	if err != nil {
		if alert, ok := remoteAlert(err); ok {
			if sessions != nil {
				sessions.Put(conn.RemoteAddr().String(), nil)
			}
			return nil, nil, cs.DidResume, refusedError(addr, cert != nil, alert)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, nil, cs.DidResume, fmt.Errorf("the evidence endpoint %s closed the connection before answering: %w", addr, err)
		}
		return nil, nil, cs.DidResume, fmt.Errorf("evidence from %s: %w", addr, err)
	}
	if keep {
		kept = outer
	}
	return verified.Result(), kept, cs.DidResume, nil
}

func finishFetch(ctx context.Context, addr string, conn net.Conn, verified *peerEvidence) (*attestation.Result, error) {
	if err := finish(ctx, conn, nil, verified); err != nil {
		return nil, fmt.Errorf("attested TLS handshake with %s: %w", addr, err)
	}
	r := verified.Result()
	if r == nil {
		return nil, fmt.Errorf("%s sent no evidence", addr)
	}
	return r, nil
}

// remoteAlert returns the TLS alert the peer sent, if err is one
// (crypto/tls reports it as a net.OpError "remote error").
func remoteAlert(err error) (string, bool) {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		return op.Err.Error(), true
	}
	return "", false
}

func refusedError(addr string, presented bool, alert string) error {
	groups := strings.Join(DefaultVerifierOrganizations(), ", ")
	if !presented {
		return fmt.Errorf("%w: %s belongs to a cluster and answers only client certificates of the cluster CA in the groups %s; "+
			"this caller presented none (%s)", ErrRefused, addr, groups, alert)
	}
	return fmt.Errorf("%w: %s refused this caller's client certificate (%s): it answers only certificates of its cluster's CA "+
		"in the groups %s", ErrRefused, addr, alert, groups)
}
