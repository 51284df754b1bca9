// Package nodelock is the node lock (docs/bootstrapper.md, "The node lock"): two states,
// one transition (unlocked → locked), taken by whichever of the InitServer
// and the JoinClient gets there first. Taking it extends the node's TPM PCR
// 15 with the cluster ID, so that "this node is initialised" is part of the
// node's attested measurements: every key-issuing endpoint expects PCR 15 to
// be zero on the requesting node.
package nodelock

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// ErrLocked means the lock was already taken, by the other contender in
// this boot or in an earlier one.
var ErrLocked = errors.New("the node lock is already taken")

// Lock is the node lock of one TPM. It is safe for concurrent use.
type Lock struct {
	mu     sync.Mutex
	tpm    io.ReadWriter
	locked bool
	holder string
	taken  chan struct{}
}

// New returns the lock of the TPM at rw. The lock starts locked when PCR
// 15 is already extended (this node was initialised before this boot's
// bootstrapper ran, e.g. a restarted bootstrapper), unlocked when it is
// zero.
func New(rw io.ReadWriter) (*Lock, error) {
	value, err := tpm2.ReadPCR(rw, keys.NodeLockPCR, tpm2.AlgSHA256)
	if err != nil {
		return nil, fmt.Errorf("reading node lock PCR %d: %w", keys.NodeLockPCR, err)
	}
	l := &Lock{tpm: rw, taken: make(chan struct{})}
	if !bytes.Equal(value, make([]byte, sha256.Size)) {
		l.locked = true
		close(l.taken)
	}
	return l, nil
}

// Taken returns a channel closed once the lock is taken.
func (l *Lock) Taken() <-chan struct{} { return l.taken }

// Locked reports whether the lock is taken.
func (l *Lock) Locked() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.locked
}

// Holder names who took the lock in this process ("" if nobody did, or
// it was taken before this process started).
func (l *Lock) Holder() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holder
}

// TryLock takes the lock for holder (e.g. "init", "join") by extending PCR
// 15 with clusterID (32 bytes). It returns ErrLocked, and changes nothing,
// when the lock is already taken. If the extension fails the lock stays
// untaken and the error says why.
func (l *Lock) TryLock(holder string, clusterID []byte) error {
	if len(clusterID) != keys.ClusterIDSize {
		return fmt.Errorf("taking the node lock: cluster ID is %d bytes, want %d", len(clusterID), keys.ClusterIDSize)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.locked {
		return ErrLocked
	}
	if err := tpm2.PCRExtend(l.tpm, tpmutil.Handle(keys.NodeLockPCR), tpm2.AlgSHA256, clusterID, ""); err != nil {
		return fmt.Errorf("taking the node lock: extending PCR %d: %w", keys.NodeLockPCR, err)
	}
	l.locked, l.holder = true, holder
	close(l.taken)
	return nil
}
