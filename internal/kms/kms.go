// Package kms provides the cluster's data-encryption keys (DEKs): derived
// from a master secret with HKDF (ClusterKMS), or random DEKs wrapped by a
// key-encryption key that never leaves a PKCS#11 token (PKCS11KMS).
//
// Key ids name what a key protects: a node's state disk (DiskKeyID),
// "measurementSecret", ... They must match IDPattern; lengths are 1 to
// MaxKeyLength bytes.
package kms

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"

	"github.com/google/uuid"
)

// MaxKeyLength is the longest key, in bytes, a KMS returns.
const MaxKeyLength = 64

// IDPattern is the charset and length of key ids: 1 to 128 characters of
// letters, digits, '.', '_' and '-', starting with a letter or digit (UUIDs,
// "measurementSecret", "clusterID").
var IDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ErrInvalidRequest wraps every error about a malformed id or length.
var ErrInvalidRequest = errors.New("invalid data key request")

// CheckRequest validates a key id and length (in bytes).
func CheckRequest(id string, length int) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: data key id is empty", ErrInvalidRequest)
	case !validID(id):
		return fmt.Errorf("%w: data key id %q must be 1-128 characters of A-Z a-z 0-9 . _ - starting with a letter or digit", ErrInvalidRequest, truncate(id))
	case length < 1 || length > MaxKeyLength:
		return fmt.Errorf("%w: length %d is outside 1-%d bytes", ErrInvalidRequest, length, MaxKeyLength)
	}
	return nil
}

// validID reports whether id matches IDPattern, without the regexp engine
// (it is on every request's path).
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

// MeasurementSecretID is the key id of the cluster's measurement secret,
// which node cluster IDs derive from (docs/keys.md).
const MeasurementSecretID = "measurementSecret"

// DiskKeyID returns the key id of a node's state disk key:
// "disk-<hex SHA-256 of identity>-<canonical disk UUID>". identity is the
// node's attestation identity (attestation.Result.Identity), so a disk key
// is bound to the machine that attested: another identity naming the same
// UUID gets a different key (docs/keys.md, "State disk keys"). diskUUID is
// an RFC 9562 UUID in text form, in either case, with or without braces or
// a urn:uuid: prefix; it is canonicalised to lower case. Errors wrap
// ErrInvalidRequest.
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
