// Package kms provides the cluster's data-encryption keys (DEKs): derived
// from a master secret with HKDF (ClusterKMS), or random DEKs wrapped by a
// key-encryption key that never leaves a PKCS#11 token (PKCS11KMS).
//
// Key ids name what a key protects: a state disk's UUID, "measurementSecret",
// ... They must match IDPattern; lengths are 1 to MaxKeyLength bytes.
package kms

import (
	"errors"
	"fmt"
	"regexp"
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
