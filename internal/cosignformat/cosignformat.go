// Package cosignformat signs and verifies release artifacts in cosign's
// formats with a key, using sigstore's Go libraries (pkg/signature,
// pkg/cryptoutils), so that `cosign verify-blob --key` and
// `cosign verify --key` accept what it signs:
//
//   - a blob signature is the base64 (standard encoding) of the signature
//     over the file's bytes, written beside it as <file>.sig
//     (cosign sign-blob --output-signature);
//   - an image signature is cosign's simple-signing payload
//     (https://github.com/containers/image/blob/main/docs/containers-signature.5.md,
//     "type": "cosign container image signature") naming the image's
//     repository and manifest digest, stored as a layer of an OCI image
//     tagged sha256-<hex>.sig whose annotation
//     dev.cosignproject.cosign/signature holds the base64 signature
//     (https://github.com/sigstore/cosign/blob/main/specs/SIGNATURE_SPEC.md).
//
// Signing keys are Ed25519 (PKCS#8 PEM, "PRIVATE KEY"): Ed25519 signatures
// are deterministic (RFC 8032 §5.1.6), so the same artifact signed twice
// gives the same bytes and a release built twice is byte-identical.
// Verification also accepts ECDSA and RSA public keys (PKIX PEM, "PUBLIC
// KEY"), as cosign does.
package cosignformat

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// SignatureSuffix is the suffix of a blob signature's file name.
const SignatureSuffix = ".sig"

// Signer signs blobs and image payloads with an Ed25519 private key.
type Signer struct {
	s signature.Signer
}

// LoadSigner parses an Ed25519 private key in PKCS#8 PEM ("PRIVATE KEY",
// as `openssl genpkey -algorithm ed25519` writes it). It errors for other
// key types (their signatures are randomized: a release would not be
// reproducible) and for malformed PEM; the error never holds key material.
func LoadSigner(privatePEM []byte) (*Signer, error) {
	priv, err := cryptoutils.UnmarshalPEMToPrivateKey(privatePEM, cryptoutils.SkipPassword)
	if err != nil {
		// The library's message names the PEM type at most, never the key.
		return nil, fmt.Errorf("reading the signing key (an Ed25519 PKCS#8 PEM private key is needed): %w", err)
	}
	key, ok := priv.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("the signing key is a %T: an Ed25519 key is needed, whose signatures are deterministic (docs/install.md, \"Signed artifacts\")", priv)
	}
	s, err := signature.LoadED25519Signer(key)
	if err != nil {
		return nil, fmt.Errorf("loading the signing key: %w", err)
	}
	return &Signer{s: s}, nil
}

// PublicKeyPEM is the signer's public key in PKIX PEM ("PUBLIC KEY"), the
// file `cosign verify --key` reads.
func (s *Signer) PublicKeyPEM() ([]byte, error) {
	pub, err := s.s.PublicKey()
	if err != nil {
		return nil, err
	}
	return cryptoutils.MarshalPublicKeyToPEM(pub)
}

// SignBlob returns the base64 signature of the bytes of r: the content of
// a cosign .sig file. Ed25519 signs the whole message, so r is read into
// memory.
func (s *Signer) SignBlob(r io.Reader) ([]byte, error) {
	sig, err := s.s.SignMessage(r)
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	return []byte(base64.StdEncoding.EncodeToString(sig)), nil
}

// GenerateKey returns a new Ed25519 key pair: the private key in PKCS#8
// PEM and the public key in PKIX PEM.
func GenerateKey() (privatePEM, publicPEM []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	privatePEM, err = cryptoutils.MarshalPrivateKeyToPEM(priv)
	if err != nil {
		return nil, nil, err
	}
	publicPEM, err = cryptoutils.MarshalPublicKeyToPEM(pub)
	if err != nil {
		return nil, nil, err
	}
	return privatePEM, publicPEM, nil
}

// Verifier checks cosign signatures with a public key.
type Verifier struct {
	v signature.Verifier
}

// errBadSignature is returned (wrapped) when a signature does not verify.
var errBadSignature = errors.New("signature does not verify with the given key")

// LoadVerifier parses a PKIX PEM public key ("PUBLIC KEY"): Ed25519,
// ECDSA or RSA; ECDSA and RSA signatures are over SHA-256, as cosign's.
func LoadVerifier(publicPEM []byte) (*Verifier, error) {
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(publicPEM)
	if err != nil {
		return nil, fmt.Errorf("reading the public key (PKIX PEM, \"PUBLIC KEY\"): %w", err)
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("loading the public key: %w", err)
	}
	return &Verifier{v: v}, nil
}

// VerifyBlob checks sigFile (a cosign .sig file: base64, surrounding
// white space ignored) over the bytes of r. It returns an error wrapping
// errBadSignature when the signature does not verify.
func (v *Verifier) VerifyBlob(r io.Reader, sigFile []byte) error {
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(sigFile)))
	if err != nil {
		return fmt.Errorf("%w: the signature is not base64: %w", errBadSignature, err)
	}
	if err := v.v.VerifySignature(bytes.NewReader(sig), r); err != nil {
		return fmt.Errorf("%w: %w", errBadSignature, err)
	}
	return nil
}

// simpleSigning is cosign's signed payload for an image: the critical
// section names the image by repository and manifest digest.
type simpleSigning struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
	Optional map[string]any `json:"optional"`
}

// simpleSigningType is the payload's critical.type.
const simpleSigningType = "cosign container image signature"

// payload returns the simple-signing payload for the manifest (or index)
// digest ("sha256:<hex>") of an image in repository (e.g.
// ghcr.io/gatehouse-dev/gatehouse-joinservice), byte for byte as cosign
// writes it.
func payload(repository, digest string) ([]byte, error) {
	var p simpleSigning
	p.Critical.Identity.DockerReference = repository
	p.Critical.Image.DockerManifestDigest = digest
	p.Critical.Type = simpleSigningType
	return json.Marshal(p)
}

// parsePayload decodes a simple-signing payload, refusing one of another
// type.
func parsePayload(payload []byte) (simpleSigning, error) {
	var p simpleSigning
	if err := json.Unmarshal(payload, &p); err != nil {
		return p, fmt.Errorf("the signed payload is not simple-signing JSON: %w", err)
	}
	if p.Critical.Type != simpleSigningType {
		return p, fmt.Errorf("the signed payload's type is %q, not %q", p.Critical.Type, simpleSigningType)
	}
	return p, nil
}
