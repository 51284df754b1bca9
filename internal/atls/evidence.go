package atls

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
)

// evidenceProtocol is the ALPN protocol of the evidence endpoint's door,
// the TLS 1.3 handshake a caller passes before any quote is made; the
// evidence then comes over the door's connection, bound to it. (Its
// first version, never released, ran an attested handshake inside the
// door; it is not answered.)
const evidenceProtocol = "gatehouse-evidence/2"

// handshakeTimeout bounds one FetchEvidence.
const handshakeTimeout = 30 * time.Second

// Defaults of EvidenceEndpoint.
const (
	// DefaultEvidenceHandshakeTimeout bounds one connection: door, quote
	// (with its wait in the queue) and key activation.
	DefaultEvidenceHandshakeTimeout = 10 * time.Second
	// DefaultQuoteQueue is how many quotes may wait while one is made.
	DefaultQuoteQueue = 4
	// defaultClientCARecheck is how often the cluster CA file is read again.
	defaultClientCARecheck = time.Second
	// DefaultEvidenceIdleTimeout is how long a door connection is kept
	// open waiting for its caller's next request: twice the join
	// service's default re-verification interval.
	DefaultEvidenceIdleTimeout = 2 * time.Minute
)

// DefaultEvidenceLimits returns the evidence endpoint's default connection
// limits: per source (IPv4 address, IPv6 /64) one new connection a second
// with a burst of 10 and 4 open at once, 256 open in all. The join
// service needs one connection per node per interval and per CSR check;
// an administrator's `gatehouse verify` one.
func DefaultEvidenceLimits() connlimit.Limits {
	return connlimit.Limits{Handshakes: connlimit.Rate{Rate: 1, Burst: 10}, PerSource: 4, Total: 256}
}

// EvidenceEndpoint is a node's evidence endpoint (`gatehouse-bootstrapper
// serve-evidence`): fresh evidence for a verifier's nonce over attested
// TLS, behind a door (see the package documentation, "The evidence
// endpoint", and docs/continuous-attestation.md, "The evidence endpoint's
// door"). Zero fields take the defaults named on them.
type EvidenceEndpoint struct {
	// Attester makes the node's evidence; required.
	Attester attestation.Attester
	// ClientCAFile is the cluster CA, PEM (kubeadm's
	// /etc/kubernetes/pki/ca.crt, written when the node joins); required.
	// While it does not exist anonymous callers are answered; once it does,
	// only callers whose client certificate chains to it and names one of
	// Organizations.
	ClientCAFile string
	// Organizations are the allowed client certificate subject
	// organizations; nil is DefaultVerifierOrganizations. A node
	// credential's group (system:nodes, system:bootstrappers) is refused.
	Organizations []string
	// Limits are applied to every connection at accept, before any TLS;
	// the zero value is DefaultEvidenceLimits.
	Limits connlimit.Limits
	// QuoteQueue is how many quotes may wait while one is made; a
	// connection beyond them gets no quote and is closed. 0 is
	// DefaultQuoteQueue.
	QuoteQueue int
	// HandshakeTimeout bounds a connection from accept to the end of the
	// key activation; a quote still waiting then leaves the queue. 0 is
	// DefaultEvidenceHandshakeTimeout.
	HandshakeTimeout time.Duration
	// ClientCARecheck is how often ClientCAFile is read again; 0 is
	// defaultClientCARecheck.
	ClientCARecheck time.Duration
	// IdleTimeout is how long a door connection waits for its caller's
	// next request once it served evidence; each request is then bounded
	// by HandshakeTimeout. 0 is DefaultEvidenceIdleTimeout; negative
	// closes every connection after its first evidence.
	IdleTimeout time.Duration
	// Log receives refusals (at most three per source, then one a minute)
	// and CA file changes; nil discards them.
	Log *slog.Logger
	// Registerer registers gatehouse_evidence_{refused_total{reason},
	// served_total,quotes_pending} and connlimit's
	// gatehouse_evidence_connections_{refused_total,open}; nil registers
	// nothing.
	Registerer prometheus.Registerer
	// Now is the clock certificates, the CA recheck and the limits use;
	// nil is time.Now.
	Now func() time.Time

	// anonymous (ServeEvidence) answers every caller, without limits.
	anonymous bool
}

// ServeEvidence answers every connection on lis as EvidenceEndpoint does,
// but to anyone (no cluster CA) and without connection limits; the quote
// queue applies. It is for tests and for listeners limited otherwise; a
// node serves with EvidenceEndpoint. It returns when ctx ends or lis fails.
func ServeEvidence(ctx context.Context, lis net.Listener, attester attestation.Attester) error {
	return EvidenceEndpoint{Attester: attester, anonymous: true}.Serve(ctx, lis)
}

// Serve answers connections on lis until ctx ends (returning ctx's error)
// or lis fails, then waits for the connections in progress to end. Errors
// before serving name the bad field.
func (e EvidenceEndpoint) Serve(ctx context.Context, lis net.Listener) error {
	s, err := e.newServer()
	if err != nil {
		return fmt.Errorf("serving evidence: %w", err)
	}
	if !e.anonymous {
		limits := e.Limits
		if limits == (connlimit.Limits{}) {
			limits = DefaultEvidenceLimits()
		}
		if lis, err = connlimit.NewListener(lis, limits, connlimit.Options{
			Now: s.now, Registerer: e.Registerer, Subsystem: "evidence",
			OnRefuse: func(source, reason string) { s.logRefusal(source, reason, "", nil) },
		}); err != nil {
			return fmt.Errorf("serving evidence: connection limits: %w", err)
		}
	}
	return s.serve(ctx, lis)
}

// evidenceServer is an EvidenceEndpoint with its defaults applied.
type evidenceServer struct {
	attester  attestation.Attester
	queue     *quoteQueue
	cas       *clientCAs // nil: anonymous
	orgs      []string
	timeout   time.Duration
	idle      time.Duration // < 0: one evidence per connection
	outerCert tls.Certificate
	tickets   ticketKeys
	now       func() time.Time
	log       *slog.Logger
	logLimit  *connlimit.Buckets
	refused   *prometheus.CounterVec
	served    prometheus.Counter
}

func (e EvidenceEndpoint) newServer() (*evidenceServer, error) {
	if e.Attester == nil {
		return nil, errors.New("no attester")
	}
	s := &evidenceServer{orgs: e.Organizations, timeout: e.HandshakeTimeout, idle: e.IdleTimeout, now: e.Now, log: e.Log}
	if s.idle == 0 {
		s.idle = DefaultEvidenceIdleTimeout
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.orgs == nil {
		s.orgs = DefaultVerifierOrganizations()
	}
	if err := checkOrganizations(s.orgs); err != nil {
		return nil, err
	}
	if s.timeout == 0 {
		s.timeout = DefaultEvidenceHandshakeTimeout
	}
	queue, recheck := e.QuoteQueue, e.ClientCARecheck
	if queue == 0 {
		queue = DefaultQuoteQueue
	}
	if recheck == 0 {
		recheck = defaultClientCARecheck
	}
	switch {
	case s.timeout < 0 || queue < 0 || recheck < 0:
		return nil, fmt.Errorf("handshake timeout %s, quote queue %d and CA recheck %s must not be negative", s.timeout, queue, recheck)
	case !e.anonymous && e.ClientCAFile == "":
		return nil, errors.New("no client CA file: name the cluster CA (kubeadm's /etc/kubernetes/pki/ca.crt)")
	case !e.anonymous:
		s.cas = &clientCAs{path: e.ClientCAFile, recheck: recheck, now: s.now, log: s.log}
	}
	s.logLimit = connlimit.NewBuckets(connlimit.Rate{Rate: 1.0 / 60, Burst: 3}, s.now)
	s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "gatehouse", Subsystem: "evidence", Name: "refused_total",
		Help: "Evidence connections accepted and then refused without evidence, by reason.",
	}, []string{"reason"})
	for _, r := range []string{ReasonAnonymous, ReasonUntrustedCertificate, ReasonOrganization, ReasonAnonymousProtocol,
		ReasonCAUnreadable, ReasonQueueFull, ReasonQuoteWaitExpired, ReasonHandshakeFailed} {
		s.refused.WithLabelValues(r)
	}
	s.served = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "gatehouse", Subsystem: "evidence", Name: "served_total",
		Help: "Evidence handshakes completed.",
	})
	pending := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "gatehouse", Subsystem: "evidence", Name: "quotes_pending",
		Help: "Quotes and key activations being made or waiting in the queue.",
	})
	if e.Registerer != nil {
		for _, c := range []prometheus.Collector{s.refused, s.served, pending} {
			if err := e.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("registering evidence metrics: %w", err)
			}
		}
	}
	s.attester, s.queue = e.Attester, newQueue(queue, pending)
	cert, err := doorCertificate(s.now())
	if err != nil {
		return nil, err
	}
	s.outerCert = cert
	return s, nil
}

// doorCurves are the door's key exchanges: X25519 alone, the cheapest.
// The door's connection carries a public client certificate, evidence and
// a one-time key activation, nothing that must stay secret for years, so
// a post-quantum hybrid's extra cost would buy nothing on every fetch
// (join tickets, which carry keys, keep the hybrid).
func doorCurves() []tls.CurveID { return []tls.CurveID{tls.X25519} }

// doorCertificate is the outer handshake's server certificate: a fresh
// Ed25519 key, self-signed. It proves nothing and callers do not check it;
// the node is authenticated by its evidence, bound to the connection.
func doorCertificate(now time.Time) (tls.Certificate, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating the door's key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "gatehouse-evidence"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signing the door's certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func (s *evidenceServer) serve(ctx context.Context, lis net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = lis.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var backoff time.Duration
	for {
		conn, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !resourceShortage(err) {
				return fmt.Errorf("serving evidence: %w", err)
			}
			// Out of file descriptors or memory for a moment (a flood):
			// wait and accept again, as net/http does, instead of exiting.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("Accepting an evidence connection failed; retrying", "error", err.Error(), "retryIn", backoff)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handle(ctx, conn)
		}()
	}
}

// resourceShortage reports whether an Accept error is a passing shortage.
func resourceShortage(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// handle serves one connection: the door (TLS 1.3 handshake, the caller
// authenticated when the node has a cluster CA), then evidence bound to
// the connection and the key activation over it. A caller of the protocol
// before the door, on a node without a cluster CA, gets the attested
// handshake at once.
func (s *evidenceServer) handle(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	source := connlimit.Source(conn.RemoteAddr())
	hctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// Every step, reads and writes included, ends with the deadline.
	stop := context.AfterFunc(hctx, func() { _ = conn.Close() })
	defer stop()

	var r refusal
	attester := queued(s.attester, s.queue, &r)
	attested, verified, err := serverConfig(hctx, Config{Attester: attester})
	if err != nil {
		s.log.Error("Making the attested TLS configuration failed", "error", err.Error())
		return
	}
	outer := tls.Server(conn, &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			return s.doorConfig(chi, attested, &r)
		},
	})
	if err := outer.HandshakeContext(hctx); err != nil {
		s.refuse(source, r, err)
		return
	}
	if outer.ConnectionState().NegotiatedProtocol != evidenceProtocol {
		// The protocol before the door: the handshake was the attested one.
		s.finish(hctx, source, outer, attester, verified, &r)
		return
	}
	if err := attestChannel(hctx, outer, attester, nil); err != nil {
		s.refuse(source, r, err)
		return
	}
	s.served.Inc()
	stop() // the connection now lives from request to request
	s.serveRequests(ctx, source, outer, attester, &r)
}

func (s *evidenceServer) finish(ctx context.Context, source string, conn net.Conn, attester attestation.Attester, verified *peerEvidence, r *refusal) {
	if err := finish(ctx, conn, attester, verified); err != nil {
		s.refuse(source, *r, err)
		return
	}
	s.served.Inc()
}

// doorConfig chooses the configuration for a ClientHello: the door for a
// client offering evidenceProtocol (requiring a client certificate of the
// cluster CA once the node has one), the attested handshake at once for
// an older client on a node without a cluster CA, and a refusal for an
// older client on a node with one.
func (s *evidenceServer) doorConfig(chi *tls.ClientHelloInfo, attested *tls.Config, r *refusal) (*tls.Config, error) {
	pool, err := s.clientPool(r)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(chi.SupportedProtos, evidenceProtocol) {
		if pool != nil {
			r.reason = ReasonAnonymousProtocol
			return nil, errLegacyProtocol
		}
		return attested, nil
	}
	keys, err := s.tickets.current(s.now())
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{s.outerCert},
		NextProtos:       []string{evidenceProtocol},
		CurvePreferences: doorCurves(),
	}
	// Tickets let the join service resume (EvidenceFetcher.Sessions): a
	// resumed session's client certificate is checked again below, and
	// its evidence is bound to the new connection all the same.
	cfg.SetSessionTicketKeys(keys)
	if pool != nil {
		// Request, and verify in VerifyConnection, to record the reason;
		// crypto/tls checks the client's CertificateVerify either way.
		cfg.ClientAuth = tls.RequestClientCert
		cfg.ClientCAs = pool
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return checkClient(cs.PeerCertificates, pool, s.orgs, s.now(), r)
		}
	}
	return cfg, nil
}

// clientPool is the cluster CA pool callers are judged by now: nil while
// the node answers anyone (no CA file yet, or an anonymous endpoint). An
// unreadable CA file refuses everyone (ReasonCAUnreadable).
func (s *evidenceServer) clientPool(r *refusal) (*x509.CertPool, error) {
	if s.cas == nil {
		return nil, nil
	}
	pool, err := s.cas.current()
	if err != nil {
		r.reason = ReasonCAUnreadable
	}
	return pool, err
}

// refuse counts and logs a connection that ended without evidence.
func (s *evidenceServer) refuse(source string, r refusal, err error) {
	reason := r.reason
	switch {
	case reason != "":
	case errors.Is(err, errQuoteQueueFull):
		reason = ReasonQueueFull
	case errors.Is(err, errQuoteWaitExpired):
		reason = ReasonQuoteWaitExpired
	default:
		reason = ReasonHandshakeFailed
	}
	s.refused.WithLabelValues(reason).Inc()
	s.logRefusal(source, reason, r.subject, err)
}

// logRefusal logs at most three refusals per source, then one a minute:
// a flood is counted, not written out.
func (s *evidenceServer) logRefusal(source, reason, subject string, err error) {
	level := slog.LevelWarn
	if reason == ReasonHandshakeFailed {
		level = slog.LevelDebug // scanners, callers that went away
	}
	// Only a line that is written spends the source's budget.
	if !s.log.Enabled(context.Background(), level) || !s.logLimit.Allow(source) {
		return
	}
	attrs := []any{"source", source, "reason", reason}
	if subject != "" {
		attrs = append(attrs, "subject", subject)
	}
	if err != nil {
		attrs = append(attrs, "error", err.Error())
	}
	s.log.Log(context.Background(), level, "Evidence caller refused", attrs...)
}
