package tpm

import (
	"crypto"
	"crypto/rand"
	"fmt"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/legacy/tpm2/credactivation"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// ActivationSecretSize is the size of a credential activation secret.
const ActivationSecretSize = 32

// ActivationChallenge is what TPM2_MakeCredential makes (TPM 2.0 Library
// Part 1, §24 "Credential Protection"), computed in software: a secret
// that only a TPM holding both the EK it was made for and a key with the
// AK's name can recover, with TPM2_ActivateCredential. Answering it proves
// the AK lives in the same TPM as the EK, whose certificate a manufacturer
// issued. Both fields are TPM2B encodings (2-byte size, big endian).
type ActivationChallenge struct {
	// Credential is the TPM2B_ID_OBJECT: the secret, encrypted and
	// integrity-protected under a seed bound to the AK's name.
	Credential []byte
	// EncryptedSecret is the TPM2B_ENCRYPTED_SECRET: the seed, encrypted
	// to the EK.
	EncryptedSecret []byte
}

// NewActivationChallenge makes a challenge for the attestation key whose
// TPMT_PUBLIC is akPublic (as TPMEvidence carries it) under ek, the EK's
// public key (RSA 2048 or ECC NIST P-256, from its EK certificate). It
// returns the challenge and its fresh ActivationSecretSize-byte secret,
// which the verifier keeps and compares with the answer in constant time.
// Errors wrap attestation.ErrMalformed when akPublic does not decode.
func NewActivationChallenge(ek crypto.PublicKey, akPublic []byte) (*ActivationChallenge, []byte, error) {
	pub, err := tpm2.DecodePublic(akPublic)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: attestation key: %w", attestation.ErrMalformed, err)
	}
	name, err := pub.Name()
	if err != nil || name.Digest == nil {
		return nil, nil, fmt.Errorf("%w: attestation key has no name digest", attestation.ErrMalformed)
	}
	secret := make([]byte, ActivationSecretSize)
	if _, err := rand.Read(secret); err != nil {
		return nil, nil, err
	}
	// AES-128 (16-byte blocks) is the symmetric scheme of the TCG's default
	// EK templates.
	cred, encSecret, err := credactivation.Generate(name.Digest, ek, 16, secret)
	if err != nil {
		return nil, nil, fmt.Errorf("making the activation challenge: %w", err)
	}
	return &ActivationChallenge{Credential: cred, EncryptedSecret: encSecret}, secret, nil
}
