package atls

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultVerifierOrganizations returns the client certificate subject
// organizations (Kubernetes groups) a node's evidence endpoint answers by
// default: the join service's own client certificate
// (clusterpki.VerifierGroup) and kubeadm's administrators
// (kubeadm:cluster-admins in admin.conf, system:masters in
// super-admin.conf).
func DefaultVerifierOrganizations() []string {
	return []string{"gatehouse:verifiers", "kubeadm:cluster-admins", "system:masters"}
}

// checkOrganizations returns an error naming an empty list, an empty name
// or a node credential's group (system:nodes, system:bootstrappers[:…]),
// which is never allowed: a compromised node must not be able to drain
// another node's TPM with its kubelet certificate, nor a joining machine
// with its bootstrap identity.
func checkOrganizations(orgs []string) error {
	if len(orgs) == 0 {
		return errors.New("no client certificate organizations allowed: name at least one")
	}
	for _, o := range orgs {
		switch {
		case o == "":
			return errors.New("an allowed client certificate organization is empty")
		case o == "system:nodes" || o == "system:bootstrappers" || strings.HasPrefix(o, "system:bootstrappers:"):
			return fmt.Errorf("client certificate organization %q is a node credential's group: a node could drain other nodes' TPMs with it", o)
		}
	}
	return nil
}

// Refusal reasons of the evidence endpoint, also the values of the reason
// label of gatehouse_evidence_refused_total. connlimit's reasons
// (handshake_rate_limited, source_connection_limit, connection_limit)
// are counted by gatehouse_evidence_connections_refused_total.
const (
	// ReasonAnonymous: no client certificate, and the node has a cluster CA.
	ReasonAnonymous = "anonymous"
	// ReasonUntrustedCertificate: the certificate does not chain to the
	// cluster CA for client authentication now.
	ReasonUntrustedCertificate = "untrusted_certificate"
	// ReasonOrganization: the certificate chains to the cluster CA, but
	// none of its organizations is allowed (a kubelet's, for instance).
	ReasonOrganization = "organization_not_allowed"
	// ReasonAnonymousProtocol: a client of the protocol before the door
	// (attested TLS at once), which cannot authenticate first, on a node
	// that has a cluster CA.
	ReasonAnonymousProtocol = "anonymous_protocol"
	// ReasonCAUnreadable: the cluster CA file exists but cannot be read or
	// parsed; every caller is refused until it can.
	ReasonCAUnreadable = "client_ca_unreadable"
	// ReasonQueueFull: the quote queue was full (errQuoteQueueFull).
	ReasonQueueFull = "quote_queue_full"
	// ReasonQuoteWaitExpired: the deadline passed while the connection's
	// quote waited (errQuoteWaitExpired).
	ReasonQuoteWaitExpired = "quote_wait_expired"
	// ReasonHandshakeFailed: any other failure (a timeout, a caller that
	// is not a TLS 1.3 client, one that went away).
	ReasonHandshakeFailed = "handshake_failed"
)

var (
	errAnonymous      = errors.New("no client certificate: this node belongs to a cluster and answers only its join service and administrators")
	errLegacyProtocol = errors.New("a client without the " + evidenceProtocol + " protocol cannot authenticate: this node belongs to a cluster")
)

// refusal is why the outer handshake refused a caller, recorded by the
// handshake's callbacks (which run on the connection's goroutine).
type refusal struct {
	reason  string
	subject string // the refused certificate's subject, not secret
}

// checkClient checks a caller's certificate chain (leaf first, as sent)
// against the cluster CA pool at now: it must chain to the pool for client
// authentication, and its subject must carry one of orgs.
func checkClient(chain []*x509.Certificate, pool *x509.CertPool, orgs []string, now time.Time, r *refusal) error {
	if len(chain) == 0 {
		r.reason = ReasonAnonymous
		return errAnonymous
	}
	leaf := chain[0]
	r.subject = leaf.Subject.String()
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: intermediates, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		r.reason = ReasonUntrustedCertificate
		return fmt.Errorf("client certificate %s does not chain to the cluster CA for client authentication: %w", leaf.Subject, err)
	}
	if !slices.ContainsFunc(leaf.Subject.Organization, func(o string) bool { return slices.Contains(orgs, o) }) {
		r.reason = ReasonOrganization
		return fmt.Errorf("client certificate %s is in none of the groups %s", leaf.Subject, strings.Join(orgs, ", "))
	}
	return nil
}

// clientCAs is the cluster CA file, read again at most every recheck: it
// appears when the node joins (kubeadm writes it), and may change (a CA
// rotation) or go (kubeadm reset). It is safe for concurrent use.
type clientCAs struct {
	path    string
	recheck time.Duration
	now     func() time.Time
	log     *slog.Logger

	mu      sync.Mutex
	checked time.Time
	read    bool
	data    []byte // the file's content as last parsed; nil while absent
	pool    *x509.CertPool
	err     error
}

// current returns the cluster CA pool; nil and no error while the file
// does not exist (anonymous callers are answered), an error while it
// exists but cannot be read or holds no CA certificate (every caller is
// refused: the node belongs to a cluster whose CA it cannot tell).
func (c *clientCAs) current() (*x509.CertPool, error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read && !now.Before(c.checked) && now.Sub(c.checked) < c.recheck {
		return c.pool, c.err
	}
	c.checked, c.read = now, true
	data, err := os.ReadFile(c.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if c.data != nil || c.err != nil {
			c.log.Warn("The cluster CA file is gone: the evidence endpoint answers anonymous callers", "file", c.path)
		}
		c.data, c.pool, c.err = nil, nil, nil
	case err != nil:
		c.fail(fmt.Errorf("reading the cluster CA %s: %w", c.path, err))
	case c.err == nil && c.data != nil && bytes.Equal(data, c.data):
		// Unchanged.
	default:
		pool, err := parseCAs(data)
		if err != nil {
			c.fail(fmt.Errorf("the cluster CA %s: %w", c.path, err))
			break
		}
		c.log.Info("The evidence endpoint answers only its cluster's join service and administrators", "clientCA", c.path)
		c.data, c.pool, c.err = data, pool, nil
	}
	return c.pool, c.err
}

func (c *clientCAs) fail(err error) {
	if c.err == nil || c.err.Error() != err.Error() {
		c.log.Error("Refusing every evidence caller until the cluster CA can be read", "error", err.Error())
	}
	c.data, c.pool, c.err = nil, nil, err
}

// parseCAs parses PEM CERTIFICATE blocks (other blocks are skipped); each
// must be a CA certificate, and there must be at least one.
func parseCAs(data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		if !cert.IsCA {
			return nil, fmt.Errorf("certificate %d (%s) is not a CA", n+1, cert.Subject)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return pool, nil
}
