package kms

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThalesGroup/crypto11"
	"golang.org/x/sync/singleflight"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// wrappedVersion prefixes a wrapped DEK: version || GCM nonce || ciphertext.
const wrappedVersion = 1

// DEKStore keeps wrapped DEKs by key id. Create must be atomic: of several
// concurrent creates for one id exactly one succeeds (created = true).
type DEKStore interface {
	Get(ctx context.Context, id string) (wrapped []byte, found bool, err error)
	Create(ctx context.Context, id string, wrapped []byte) (created bool, err error)
}

// PKCS11KMS hands out random DEKs, generated on first request for an id,
// wrapped with AES-256-GCM by a key-encryption key (KEK) that stays inside a
// PKCS#11 token, and kept wrapped in a DEKStore. Every DEK is keys.MaxDataKeySize
// bytes; a request for fewer bytes gets a prefix, as with ClusterKMS.
type PKCS11KMS struct {
	kek   cipher.AEAD
	store DEKStore
	group singleflight.Group
}

// NewPKCS11KMS returns a KMS wrapping with kek (an AEAD backed by the token)
// and storing in store.
func NewPKCS11KMS(kek cipher.AEAD, store DEKStore) *PKCS11KMS {
	return &PKCS11KMS{kek: kek, store: store}
}

// OpenPKCS11 opens the token named by uri and finds its KEK by label. Close
// the returned context when done.
func OpenPKCS11(uri *PKCS11URI) (*crypto11.Context, cipher.AEAD, error) {
	pin, err := uri.ReadPIN()
	if err != nil {
		return nil, nil, err
	}
	ctx, err := crypto11.Configure(&crypto11.Config{Path: uri.Module, TokenLabel: uri.Token, Pin: pin, GCMIVLength: 12})
	if err != nil {
		return nil, nil, fmt.Errorf("opening PKCS#11 token %q: %w", uri.Token, err)
	}
	key, err := ctx.FindKey(nil, []byte(uri.KeyLabel))
	if err != nil {
		_ = ctx.Close()
		return nil, nil, fmt.Errorf("finding KEK %q on token %q: %w", uri.KeyLabel, uri.Token, err)
	}
	if key == nil {
		_ = ctx.Close()
		return nil, nil, fmt.Errorf("no KEK labelled %q on token %q: create an AES-256 key with that label", uri.KeyLabel, uri.Token)
	}
	aead, err := key.NewGCM()
	if err != nil {
		_ = ctx.Close()
		return nil, nil, fmt.Errorf("KEK %q cannot do AES-GCM: %w", uri.KeyLabel, err)
	}
	return ctx, aead, nil
}

// GetDataKey returns the DEK for id, creating and storing it on first use.
// Concurrent first requests for one id, in this process or in others sharing
// the store, all get the same key.
func (k *PKCS11KMS) GetDataKey(ctx context.Context, id string, length int) ([]byte, error) {
	if err := keys.CheckRequest(id, length); err != nil {
		return nil, err
	}
	v, err, _ := k.group.Do(id, func() (any, error) { return k.getOrCreate(ctx, id) })
	if err != nil {
		return nil, err
	}
	dek := v.([]byte)
	return append([]byte(nil), dek[:length]...), nil
}

func (k *PKCS11KMS) getOrCreate(ctx context.Context, id string) ([]byte, error) {
	wrapped, found, err := k.store.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("reading wrapped data key %s: %w", id, err)
	}
	if found {
		return k.unwrap(id, wrapped)
	}
	dek := make([]byte, keys.MaxDataKeySize)
	if _, err := rand.Read(dek); err != nil {
		return nil, fmt.Errorf("generating data key: %w", err)
	}
	wrapped, err = k.wrap(id, dek)
	if err != nil {
		return nil, err
	}
	created, err := k.store.Create(ctx, id, wrapped)
	if err != nil {
		return nil, fmt.Errorf("storing wrapped data key %s: %w", id, err)
	}
	if created {
		return dek, nil
	}
	// Another replica created it first: use theirs.
	wrapped, found, err = k.store.Get(ctx, id)
	if err != nil || !found {
		return nil, fmt.Errorf("reading wrapped data key %s after losing the race to create it: found=%t: %w", id, found, err)
	}
	return k.unwrap(id, wrapped)
}

// aad binds a wrapped DEK to its id, so a blob cannot be moved to another id.
func aad(id string) []byte {
	return []byte("gatehouse-dek-v" + strconv.Itoa(wrappedVersion) + ":" + id)
}

func (k *PKCS11KMS) wrap(id string, dek []byte) ([]byte, error) {
	nonce := make([]byte, k.kek.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("generating nonce: %w", err)
	}
	out := append([]byte{wrappedVersion}, nonce...)
	return k.kek.Seal(out, nonce, dek, aad(id)), nil
}

func (k *PKCS11KMS) unwrap(id string, wrapped []byte) ([]byte, error) {
	n := k.kek.NonceSize()
	if len(wrapped) < 1+n || wrapped[0] != wrappedVersion {
		return nil, fmt.Errorf("wrapped data key %s: unknown format", id)
	}
	dek, err := k.kek.Open(nil, wrapped[1:1+n], wrapped[1+n:], aad(id))
	if err != nil {
		return nil, fmt.Errorf("unwrapping data key %s: %w", id, errUnwrap)
	}
	if len(dek) != keys.MaxDataKeySize {
		return nil, fmt.Errorf("wrapped data key %s has %d bytes, want %d", id, len(dek), keys.MaxDataKeySize)
	}
	return dek, nil
}

// errUnwrap hides the AEAD's error text behind a fixed message.
var errUnwrap = errors.New("authentication failed: wrong KEK, or the blob was altered or moved to another id")
