package kms

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// ClusterKMS derives keys from the cluster's master secret:
// key = HKDF-SHA256(IKM = master secret, salt, info = keys.Info(id), L = length)
// (RFC 5869). Deriving the same id with a shorter length yields a prefix of
// the longer key. The extract step (RFC 5869 §2.2), the same for every id, is
// done once: each request only expands the pseudorandom key.
type ClusterKMS struct {
	prk []byte
}

// NewClusterKMS returns a ClusterKMS, refusing a master secret shorter than
// keys.MinMasterSecretSize or a salt shorter than keys.MinMasterSaltSize.
func NewClusterKMS(masterSecret, salt []byte) (*ClusterKMS, error) {
	if len(masterSecret) < keys.MinMasterSecretSize {
		return nil, fmt.Errorf("master secret has %d bytes, at least %d required", len(masterSecret), keys.MinMasterSecretSize)
	}
	if len(salt) < keys.MinMasterSaltSize {
		return nil, fmt.Errorf("master salt has %d bytes, at least %d required", len(salt), keys.MinMasterSaltSize)
	}
	prk, err := hkdf.Extract(sha256.New, masterSecret, salt)
	if err != nil {
		return nil, fmt.Errorf("extracting pseudorandom key: %w", err)
	}
	return &ClusterKMS{prk: prk}, nil
}

// GetDataKey returns the key for id, length bytes long.
func (k *ClusterKMS) GetDataKey(_ context.Context, id string, length int) ([]byte, error) {
	if err := keys.CheckRequest(id, length); err != nil {
		return nil, err
	}
	key, err := hkdf.Expand(sha256.New, k.prk, keys.Info(id), length)
	if err != nil {
		return nil, fmt.Errorf("deriving key: %w", err)
	}
	return key, nil
}
