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

// DoorTicketKeyLifetime is how long a node's evidence endpoint issues
// session tickets (RFC 8446 §4.6.1) under one key; a ticket is accepted
// while its key is the current or the previous one, so for at most twice
// this long. A node that restarts forgets its keys, and callers make a full
// handshake.
const DoorTicketKeyLifetime = 10 * time.Minute

// DefaultEvidenceSessions is a size for EvidenceFetcher.Sessions
// (tls.NewLRUClientSessionCache): one session per node of a large cluster.
const DefaultEvidenceSessions = 20000

// ticketKeys are a node's door session ticket keys, rotated every
// DoorTicketKeyLifetime, the previous one kept for decryption.
type ticketKeys struct {
	mu   sync.Mutex
	keys [][32]byte // current first
	born time.Time
}

// current returns the keys for tls.Config.SetSessionTicketKeys at now,
// rotating first when the current key is DoorTicketKeyLifetime old.
func (t *ticketKeys) current(now time.Time) ([][32]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.keys) > 0 && now.Sub(t.born) < DoorTicketKeyLifetime && !now.Before(t.born) {
		return t.keys, nil
	}
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return nil, fmt.Errorf("generating a session ticket key: %w", err)
	}
	keys := [][32]byte{key}
	// The current key becomes the previous one, unless it stopped being
	// current (born + lifetime) a lifetime ago or more.
	if len(t.keys) > 0 && now.Sub(t.born) < 2*DoorTicketKeyLifetime && !now.Before(t.born) {
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
	s := certSessions{inner: inner}
	if cert != nil && len(cert.Certificate) > 0 {
		sum := sha256.Sum256(cert.Certificate[0])
		s.cert = hex.EncodeToString(sum[:8])
	}
	return s
}

func (s certSessions) Get(key string) (*tls.ClientSessionState, bool) {
	return s.inner.Get(s.cert + " " + key)
}

func (s certSessions) Put(key string, cs *tls.ClientSessionState) {
	s.inner.Put(s.cert+" "+key, cs)
}
