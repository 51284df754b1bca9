package tpm

import (
	"crypto"
	"fmt"
	"sync"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// akMemoSize bounds the attestation keys an akMemo holds; past it, it
// starts afresh. 4096 keys take about 1 MiB.
const akMemoSize = 4096

// akMemo remembers the attestation keys a verifier decoded, by their
// TPMT_PUBLIC bytes, so that a node attesting again costs no second
// decoding, attribute check and identity hash (docs/benchmarks.md, issue
// 35). Decoding is a pure function of the bytes; what the policy trusts is
// decided afresh every time. It is safe for concurrent use.
type akMemo struct {
	mu   sync.Mutex
	keys map[string]decodedAK
}

// decodedAK is an attestation key that decodes, has the attributes of an
// AK, and its identity.
type decodedAK struct {
	key      crypto.PublicKey
	identity string
}

// decode returns the key and identity of an AK's TPMT_PUBLIC, checking
// its attributes (requiredAKAttributes). Errors wrap
// attestation.ErrMalformed or attestation.ErrUntrustedKey.
func (m *akMemo) decode(tpmtPublic []byte) (decodedAK, error) {
	m.mu.Lock()
	ak, ok := m.keys[string(tpmtPublic)]
	m.mu.Unlock()
	if ok {
		return ak, nil
	}
	pub, err := tpm2.DecodePublic(tpmtPublic)
	if err != nil {
		return decodedAK{}, fmt.Errorf("%w: decoding attestation key: %w", attestation.ErrMalformed, err)
	}
	if pub.Attributes&requiredAKAttributes != requiredAKAttributes {
		return decodedAK{}, fmt.Errorf("%w: attestation key is not a restricted, TPM-resident signing key (attributes %#x)",
			attestation.ErrUntrustedKey, uint32(pub.Attributes))
	}
	key, err := pub.Key()
	if err != nil {
		return decodedAK{}, fmt.Errorf("%w: attestation key: %w", attestation.ErrMalformed, err)
	}
	identity, err := Identity(key)
	if err != nil {
		return decodedAK{}, fmt.Errorf("%w: attestation key: %w", attestation.ErrMalformed, err)
	}
	ak = decodedAK{key: key, identity: identity}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys == nil || len(m.keys) >= akMemoSize {
		m.keys = map[string]decodedAK{}
	}
	m.keys[string(tpmtPublic)] = ak
	return ak, nil
}
