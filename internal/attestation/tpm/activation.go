package tpm

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"fmt"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/legacy/tpm2/credactivation"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// activationSecretSize is the size of a credential activation secret.
const activationSecretSize = 32

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

// newActivationChallenge makes a challenge for the attestation key whose
// TPMT_PUBLIC is akPublic (as TPMEvidence carries it) under ek, the EK's
// public key (RSA 2048 or ECC NIST P-256, from its EK certificate). It
// returns the challenge and its fresh activationSecretSize-byte secret,
// which the verifier keeps and compares with the answer in constant time.
// Errors wrap attestation.ErrMalformed when akPublic does not decode.
func newActivationChallenge(ek crypto.PublicKey, akPublic []byte) (*ActivationChallenge, []byte, error) {
	pub, err := tpm2.DecodePublic(akPublic)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: attestation key: %w", attestation.ErrMalformed, err)
	}
	name, err := pub.Name()
	if err != nil || name.Digest == nil {
		return nil, nil, fmt.Errorf("%w: attestation key has no name digest", attestation.ErrMalformed)
	}
	secret := make([]byte, activationSecretSize)
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

// ekEndorsement is what the evidence's EK certificate says about its AK.
type ekEndorsement struct {
	// desc is how the AK is trusted (Result.Endorsement).
	desc string
	// activation is the credential activation the evidence asks for, when
	// it carries an EK certificate.
	activation attestation.KeyActivation
	// name names the EK certificate when it is what the AK is trusted by
	// (Result.EKCertificate).
	name *attestation.CertificateName
}

// endorsement returns how the evidence's AK is trusted and, when the
// evidence carries an EK certificate, the credential activation it asks
// for. With EK roots the certificate is required and must chain to them,
// and then names an identity; with another trust anchor a certificate sent
// along is still activated against (the attester waits for the
// challenge), but its chain is not what makes the AK trusted, and it
// proves no identity.
func (v *QuoteVerifier) endorsement(ev *attestationv1.TPMEvidence) (ekEndorsement, error) {
	mode := v.mode
	if mode == modeBound {
		// The hardware report vouches for the AK; an EK adds nothing.
		return ekEndorsement{desc: mode}, nil
	}
	der := ev.GetEndorsementKeyCertificate()
	if len(der) == 0 {
		if mode == "ek-certificate" {
			return ekEndorsement{}, fmt.Errorf("%w: the evidence carries no EK certificate, and the policy trusts only attestation keys "+
				"activated against an EK certificate from its ekRoots (a TPM without one in NV index 0x01c00002 needs a pinned AK)", attestation.ErrUntrustedKey)
		}
		return ekEndorsement{desc: mode}, nil
	}
	ek, err := parseEKCertificate(der)
	if err != nil {
		return ekEndorsement{}, err
	}
	pub, ok := ek.Certificate.PublicKey.(*rsa.PublicKey)
	if !ok || pub.N.BitLen() != 2048 {
		return ekEndorsement{}, fmt.Errorf("%w: the EK certificate holds a %T key; only RSA 2048 EKs (the TCG default template) can be activated against",
			attestation.ErrUntrustedKey, ek.Certificate.PublicKey)
	}
	act := &activation{ek: pub, akPublic: ev.GetAttestationKey()}
	if mode != "ek-certificate" {
		return ekEndorsement{desc: mode, activation: act}, nil
	}
	if err := ek.Verify(v.policy.Endorsement.EKRoots, v.policy.Endorsement.EKIntermediates, v.now()); err != nil {
		return ekEndorsement{}, err
	}
	desc := fmt.Sprintf("ek-certificate manufacturer=%s model=%s issuer=%q serial=%s",
		ek.Manufacturer, ek.Model, ek.Certificate.Issuer.String(), ek.Certificate.SerialNumber.Text(16))
	name := &attestation.CertificateName{Issuer: ek.Certificate.RawIssuer, Serial: ek.Certificate.SerialNumber}
	return ekEndorsement{desc: desc, activation: act, name: name}, nil
}

// activation is the credential activation a tpm Result asks for: a
// challenge for the evidence's AK under its EK.
type activation struct {
	ek       *rsa.PublicKey
	akPublic []byte
}

// Challenge returns a marshalled TPMActivationChallenge and its secret.
func (a *activation) Challenge() ([]byte, []byte, error) {
	c, secret, err := newActivationChallenge(a.ek, a.akPublic)
	if err != nil {
		return nil, nil, err
	}
	challenge, err := proto.Marshal(&attestationv1.TPMActivationChallenge{Credential: c.Credential, EncryptedSecret: c.EncryptedSecret})
	if err != nil {
		return nil, nil, err
	}
	return challenge, secret, nil
}

// ParseActivationChallenge decodes a marshalled TPMActivationChallenge,
// refusing more than attestation.MaxActivationSize bytes, unknown fields
// and empty parts. Errors wrap attestation.ErrMalformed.
func ParseActivationChallenge(data []byte) (*ActivationChallenge, error) {
	if len(data) > attestation.MaxActivationSize {
		return nil, fmt.Errorf("%w: activation challenge of %d bytes exceeds %d", attestation.ErrMalformed, len(data), attestation.MaxActivationSize)
	}
	m := &attestationv1.TPMActivationChallenge{}
	if err := attestation.DecodeEvidence(data, m); err != nil {
		return nil, err
	}
	if len(m.GetCredential()) < 2 || len(m.GetEncryptedSecret()) < 2 {
		return nil, fmt.Errorf("%w: activation challenge lacks its credential or encrypted secret", attestation.ErrMalformed)
	}
	return &ActivationChallenge{Credential: m.GetCredential(), EncryptedSecret: m.GetEncryptedSecret()}, nil
}
