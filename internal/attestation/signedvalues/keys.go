package signedvalues

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
)

// GenerateKey returns a new Ed25519 signing key pair: the private key as
// PKCS#8 PEM ("PRIVATE KEY") and the public key as PKIX PEM ("PUBLIC
// KEY"), the files `gatehouse image keygen` writes.
func GenerateKey() (privatePEM, publicPEM []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating an Ed25519 key: %w", err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), nil
}

// ParsePrivateKey reads a signing key: PEM "PRIVATE KEY" (PKCS#8) holding
// an Ed25519 or ECDSA P-256 key, or "EC PRIVATE KEY" (SEC 1) holding a
// P-256 key. Other algorithms and curves are errors naming what was found.
// Errors never contain key material.
func ParsePrivateKey(pemData []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(pemData)
	if block == nil {
		return nil, errors.New("signing key: no PEM block found; want a PKCS#8 \"PRIVATE KEY\" (gatehouse image keygen writes one)")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("signing key: PEM block %q; want \"PRIVATE KEY\" (PKCS#8) or \"EC PRIVATE KEY\"", block.Type)
	}
	if err != nil {
		return nil, errors.New("signing key: the PEM block does not hold a valid PKCS#8 or SEC 1 private key")
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("signing key: %T cannot sign", key)
	}
	if err := checkAlgorithm(signer.Public()); err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	return signer, nil
}

// ParsePublicKey reads a verification key: PEM "PUBLIC KEY" (PKIX) holding
// an Ed25519 or ECDSA P-256 key.
func ParsePublicKey(pemData []byte) (crypto.PublicKey, error) {
	block, _ := pem.Decode(pemData)
	if block == nil {
		return nil, errors.New("verify key: no PEM block found; want a PKIX \"PUBLIC KEY\" (gatehouse image keygen writes one)")
	}
	if block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("verify key: PEM block %q; want the signer's public key, a PKIX \"PUBLIC KEY\" (never pass the private key)", block.Type)
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("verify key: %w", err)
	}
	if err := checkAlgorithm(pub); err != nil {
		return nil, fmt.Errorf("verify key: %w", err)
	}
	return pub, nil
}

// checkAlgorithm accepts Ed25519 and ECDSA P-256 public keys.
func checkAlgorithm(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return fmt.Errorf("ECDSA on %s; only P-256 is accepted", k.Curve.Params().Name)
		}
		return nil
	default:
		return fmt.Errorf("%T keys are not accepted; use Ed25519 or ECDSA P-256", pub)
	}
}

// KeyID names a public key in a signature: the hex SHA-256 of its PKIX
// (SubjectPublicKeyInfo) DER encoding, 64 characters.
func KeyID(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("key id: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// dsseSigner adapts a crypto.Signer to the DSSE library's Signer: Ed25519
// signs the pre-authentication encoding (PAE) itself, ECDSA P-256 its
// SHA-256 digest (ASN.1 DER signature), as DSSE's reference signers do.
type dsseSigner struct {
	key   crypto.Signer
	keyID string
}

func (s dsseSigner) Sign(_ context.Context, pae []byte) ([]byte, error) {
	if _, ok := s.key.Public().(ed25519.PublicKey); ok {
		return s.key.Sign(rand.Reader, pae, crypto.Hash(0))
	}
	digest := sha256.Sum256(pae)
	return s.key.Sign(rand.Reader, digest[:], crypto.SHA256)
}

func (s dsseSigner) KeyID() (string, error) { return s.keyID, nil }

// dsseVerifier checks DSSE signatures of one public key.
type dsseVerifier struct {
	pub   crypto.PublicKey
	keyID string
}

func (v dsseVerifier) Verify(_ context.Context, pae, sig []byte) error {
	switch k := v.pub.(type) {
	case ed25519.PublicKey:
		if !ed25519.Verify(k, pae, sig) {
			return errors.New("ed25519 signature does not verify")
		}
	case *ecdsa.PublicKey:
		digest := sha256.Sum256(pae)
		if !ecdsa.VerifyASN1(k, digest[:], sig) {
			return errors.New("ecdsa signature does not verify")
		}
	default:
		return fmt.Errorf("%T keys are not accepted", v.pub)
	}
	return nil
}

func (v dsseVerifier) KeyID() (string, error) { return v.keyID, nil }

func (v dsseVerifier) Public() crypto.PublicKey { return v.pub }
