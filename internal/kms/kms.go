// Package kms provides the cluster's data-encryption keys (DEKs): derived
// from a master secret with HKDF (ClusterKMS), or random DEKs wrapped by a
// key-encryption key that never leaves a PKCS#11 token (PKCS11KMS). Key ids,
// sizes and request checks are the key hierarchy's (package keys,
// docs/keys.md).
package kms
