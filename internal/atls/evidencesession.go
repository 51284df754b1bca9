package atls

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"sync"
	"time"
)

// doorTicketKeyLifetime is how long a node's evidence endpoint issues
// session tickets (RFC 8446 §4.6.1) under one key; a ticket is accepted
// while its key is the current or the previous one, so for at most twice
// this long. A node that restarts forgets its keys, and callers make a full
// handshake.
const doorTicketKeyLifetime = 10 * time.Minute

// DefaultEvidenceSessions is a size for EvidenceFetcher.Sessions
// (tls.NewLRUClientSessionCache): one session per node of a large cluster.
const DefaultEvidenceSessions = 20000

// ticketKeys are a node's door session ticket keys, rotated every
// doorTicketKeyLifetime, the previous one kept for decryption.
type ticketKeys struct {
	mu   sync.Mutex
	keys [][32]byte // current first
	born time.Time
}

// current returns the keys for tls.Config.SetSessionTicketKeys at now,
// rotating first when the current key is doorTicketKeyLifetime old.
func (t *ticketKeys) current(now time.Time) ([][32]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.keys) > 0 && now.Sub(t.born) < doorTicketKeyLifetime && !now.Before(t.born) {
		return t.keys, nil
	}
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return nil, fmt.Errorf("generating a session ticket key: %w", err)
	}
	keys := [][32]byte{key}
	// The current key becomes the previous one, unless it stopped being
	// current (born + lifetime) a lifetime ago or more.
	if len(t.keys) > 0 && now.Sub(t.born) < 2*doorTicketKeyLifetime && !now.Before(t.born) {
		keys = append(keys, t.keys[0])
	}
	t.keys, t.born = keys, now
	return t.keys, nil
}

// certSessions keys a caller's door sessions by the client certificate it
// presents as well as by the node's address: a session resumed carries
// the certificate of the handshake that made it, so once the caller
// renews its certificate it starts new sessions, and the node never sees
// a certificate that has since expired.
type certSessions struct {
	inner tls.ClientSessionCache
	cert  string // hex of SHA-256 of the leaf, "" for none
}

func newCertSessions(inner tls.ClientSessionCache, cert *tls.Certificate) certSessions {
	return certSessions{inner: inner, cert: certID(cert)}
}

// certID names a client certificate in cache keys: the hex of the first
// 8 bytes of its leaf's SHA-256, "" for none.
func certID(cert *tls.Certificate) string {
	if cert == nil || len(cert.Certificate) == 0 {
		return ""
	}
	sum := sha256.Sum256(cert.Certificate[0])
	return hex.EncodeToString(sum[:8])
}

// EvidenceConns keeps door connections open between fetches
// (EvidenceFetcher.Conns), one per node address and client certificate,
// at most a fixed number; each is used by one fetch at a time. A node
// closes a connection its caller leaves idle (EvidenceEndpoint's
// IdleTimeout); the next fetch then makes a new one. Safe for concurrent
// use.
type EvidenceConns struct {
	mu    sync.Mutex
	conns map[string]*tls.Conn
	max   int
}

// NewEvidenceConns keeps at most max connections (DefaultEvidenceSessions
// for a large cluster: an idle TLS connection holds a few KiB here and a
// socket on both ends).
func NewEvidenceConns(max int) *EvidenceConns {
	return &EvidenceConns{conns: map[string]*tls.Conn{}, max: max}
}

// take removes and returns the connection kept for key, or nil.
func (p *EvidenceConns) take(key string) *tls.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.conns[key]
	delete(p.conns, key)
	return c
}

// put keeps c for key, or closes it when one is kept already or the
// pool is full.
func (p *EvidenceConns) put(key string, c *tls.Conn) {
	p.mu.Lock()
	_, exists := p.conns[key]
	if !exists && len(p.conns) < p.max {
		p.conns[key] = c
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// Close closes every kept connection.
func (p *EvidenceConns) Close() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[string]*tls.Conn{}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (s certSessions) Get(key string) (*tls.ClientSessionState, bool) {
	return s.inner.Get(s.cert + " " + key)
}

func (s certSessions) Put(key string, cs *tls.ClientSessionState) {
	s.inner.Put(s.cert+" "+key, cs)
}
