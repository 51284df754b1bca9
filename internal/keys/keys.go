// Package keys is the cluster's key hierarchy (docs/keys.md, "Key
// hierarchy"): the ids of the data keys derived from the master secret,
// their sizes, the cluster ID derived from the measurement secret, and the
// node-lock PCR the cluster ID is extended into. Every component that
// derives, asks for or checks one of these values takes it from here.
//
//	master secret + master salt
//	├── HKDF(…, Info(DiskKeyID(identity, uuid)), StateDiskKeySize)  state disk key
//	├── HKDF(…, Info(EtcdEncryptionKeyID(g)), EtcdEncryptionKeySize) KMS v2 KEK of generation g
//	└── HKDF(…, Info(MeasurementSecretID), MeasurementSecretSize)   measurement secret
//	        └── DeriveClusterID(measurement secret, measurement salt) → PCR NodeLockPCR
package keys

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// Sizes in bytes.
const (
	// MinMasterSecretSize and MinMasterSaltSize are the shortest master
	// secret and salt a cluster KMS accepts; the CLI generates 32 of each.
	MinMasterSecretSize = 16
	MinMasterSaltSize   = 32
	// MaxDataKeySize is the longest data key a KMS returns.
	MaxDataKeySize = 64
	// StateDiskKeySize is the size of a node's state disk key (a LUKS2
	// passphrase).
	StateDiskKeySize = 32
	// MeasurementSecretSize is the size of the measurement secret.
	MeasurementSecretSize = 32
	// MeasurementSaltSize is the size of the measurement salt the CLI
	// generates at init and every node records on its state disk.
	MeasurementSaltSize = 32
	// ClusterIDSize is the size of a cluster ID (SHA-256 output, the size
	// of the PCR bank it is extended into).
	ClusterIDSize = sha256.Size
)

// NodeLockPCR is the PCR (SHA-256 bank) the bootstrapper extends with the
// cluster ID when it takes the node lock: every key-issuing endpoint expects
// it to be zero on a joining node and the cluster's value on a rejoining one
// (docs/bootstrapper.md, "The node lock").
const NodeLockPCR = 15

// Key ids.
const (
	// MeasurementSecretID is the data key id of the cluster's measurement
	// secret.
	MeasurementSecretID = "measurementSecret"
	// clusterIDInfo is the id the cluster ID is derived under from the
	// measurement secret.
	clusterIDInfo = "clusterID"
)

// EtcdEncryptionKeySize is the size of the key-encryption key the KMS v2
// plugin encrypts the API server's data-encryption keys with (AES-256).
const EtcdEncryptionKeySize = 32

// EtcdEncryptionGeneration is the KMS v2 KEK generation clusters are
// initialised with and control planes are given when they join.
const EtcdEncryptionGeneration = 1

// EtcdEncryptionKeyID returns the data key id of generation g (≥ 1) of
// the KMS v2 plugin's key-encryption key: "etcd-encryption-v<g>"
// (docs/keys.md, "Secrets encrypted in etcd").
func EtcdEncryptionKeyID(g int) string { return fmt.Sprintf("etcd-encryption-v%d", g) }

// ErrInvalidRequest wraps every error about a malformed key id or length.
var ErrInvalidRequest = errors.New("invalid data key request")

// Info returns the HKDF info of key id: "key-" + id (docs/keys.md). Every
// key of the hierarchy is HKDF-SHA256(IKM, salt, Info(id), length)
// (RFC 5869).
func Info(id string) string { return "key-" + id }

// DeriveClusterID returns the cluster ID: HKDF-SHA256(measurementSecret,
// measurementSalt, Info("clusterID"), ClusterIDSize) (RFC 5869). Neither
// input may be empty.
func DeriveClusterID(measurementSecret, measurementSalt []byte) ([]byte, error) {
	if len(measurementSecret) == 0 || len(measurementSalt) == 0 {
		return nil, errors.New("deriving the cluster ID: measurement secret and salt must not be empty")
	}
	id, err := hkdf.Key(sha256.New, measurementSecret, measurementSalt, Info(clusterIDInfo), ClusterIDSize)
	if err != nil {
		return nil, fmt.Errorf("deriving the cluster ID: %w", err)
	}
	return id, nil
}

// ExpectedNodeLockPCR returns NodeLockPCR's value after the node lock was
// taken with clusterID on a TPM whose PCR was zero:
// SHA-256(32 zero bytes || clusterID) (TPM 2.0 Library, Part 1, 17.6.2
// "Extend").
func ExpectedNodeLockPCR(clusterID []byte) []byte {
	h := sha256.New()
	h.Write(make([]byte, sha256.Size))
	h.Write(clusterID)
	return h.Sum(nil)
}

// DiskKeyID returns the key id of a node's state disk key:
// "disk-<hex SHA-256 of identity>-<canonical disk UUID>" (106 characters).
// identity is the node's attestation identity (attestation.Result.Identity),
// so a disk key is bound to the machine that attested: another identity
// naming the same UUID gets a different key (docs/keys.md, "State disk
// keys"). diskUUID is an RFC 9562 UUID in text form, in either case, with or
// without braces or a urn:uuid: prefix; it is canonicalised to lower case.
// Errors wrap ErrInvalidRequest.
func DiskKeyID(identity, diskUUID string) (string, error) {
	if identity == "" {
		return "", fmt.Errorf("%w: a disk key needs the node's attestation identity", ErrInvalidRequest)
	}
	u, err := uuid.Parse(diskUUID)
	if err != nil || u.Variant() != uuid.RFC4122 {
		return "", fmt.Errorf("%w: disk UUID %q is not an RFC 9562 UUID (8-4-4-4-12 hex digits)", ErrInvalidRequest, truncate(diskUUID))
	}
	sum := sha256.Sum256([]byte(identity))
	return "disk-" + hex.EncodeToString(sum[:]) + "-" + u.String(), nil
}

// CheckRequest validates a data key id and length in bytes: ids are 1 to
// 128 characters of A-Z a-z 0-9 . _ - starting with a letter or digit
// (`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`), lengths 1 to MaxDataKeySize.
// Errors wrap ErrInvalidRequest and name what was wrong.
func CheckRequest(id string, length int) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: data key id is empty", ErrInvalidRequest)
	case !validID(id):
		return fmt.Errorf("%w: data key id %q must be 1-128 characters of A-Z a-z 0-9 . _ - starting with a letter or digit", ErrInvalidRequest, truncate(id))
	case length < 1 || length > MaxDataKeySize:
		return fmt.Errorf("%w: length %d is outside 1-%d bytes", ErrInvalidRequest, length, MaxDataKeySize)
	}
	return nil
}

// validID reports whether id matches the id pattern, without the regexp
// engine (it is on every request's path).
func validID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// truncate shortens an id for an error message; ids are not secret, but a
// caller may send anything.
func truncate(id string) string {
	if len(id) > 64 {
		return id[:64] + "..."
	}
	return id
}
