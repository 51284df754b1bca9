package kmsplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// KEKs are a control plane's KMS v2 key-encryption keys by generation, as
// the first control plane derives them and the join service hands them to
// the others. Their file (MarshalKEKs) is JSON, {"1": "<base64>", …},
// mode 0600, on the node's encrypted state disk.
type KEKs map[int][]byte

// MarshalKEKs encodes k for its file, refusing a generation below 1 or a
// key not keys.EtcdEncryptionKeySize bytes long.
func MarshalKEKs(k KEKs) ([]byte, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	return json.Marshal(k)
}

// ReadKEKs reads a KEK file; errors name the file, never a key.
func ReadKEKs(path string) (KEKs, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var k KEKs
	if err := json.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: not a KEK file (JSON of generation to base64 key)", path)
	}
	if err := k.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

func (k KEKs) check() error {
	if len(k) == 0 {
		return errors.New("no key-encryption key")
	}
	for g, key := range k {
		if g < 1 || len(key) != keys.EtcdEncryptionKeySize {
			return fmt.Errorf("generation %d: want a generation of at least 1 and a %d-byte key", g, keys.EtcdEncryptionKeySize)
		}
	}
	return nil
}

// Generations returns the oldest and the newest generation in k.
func (k KEKs) Generations() (oldest, current int) {
	gens := make([]int, 0, len(k))
	for g := range k {
		gens = append(gens, g)
	}
	return slices.Min(gens), slices.Max(gens)
}

// GetDataKey returns the KEK whose data key id (keys.EtcdEncryptionKeyID)
// is id; an id of a generation k does not hold is an error.
func (k KEKs) GetDataKey(_ context.Context, id string, length int) ([]byte, error) {
	for g, key := range k {
		if keys.EtcdEncryptionKeyID(g) == id && length == len(key) {
			return slices.Clone(key), nil
		}
	}
	return nil, fmt.Errorf("no key-encryption key %s of %d bytes on this control plane", id, length)
}
