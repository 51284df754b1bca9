package tpm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	_ "embed" // the AWS Nitro root
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/veraison/go-cose"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// awsNitroRoot is the AWS Nitro Enclaves root certificate (CN=aws.nitro-enclaves,
// 2019-10-28 → 2049-10-28), which signs NitroTPM attestation documents'
// certificate chains (nitroroots/README.md gives its source and fingerprint).
//
//go:embed nitroroots/aws-nitro-enclaves-root-g1.pem
var awsNitroRoot []byte

// awsNitroRootSHA256 is the root's published SHA-256 fingerprint, checked
// when the embedded file is loaded.
const awsNitroRootSHA256 = "641a0321a3e244efe456463195d606317ed7cdcc3c1756e09893f3c68f79bb5b"

// Bounds on a NitroTPM attestation document (AWS: the document is about 5
// KiB; NSM limits nonce, user data and public key to 512, 512 and 1024
// bytes).
const (
	maxNitroDocument = 16 << 10
	maxNitroField    = 1024
	nitroPCRSize     = 48 // SHA-384
)

// NitroEndorsement trusts AWS NitroTPM vTPMs by the NitroTPM attestation
// document the Nitro hypervisor signs (aws/NitroTPM-Tools
// nitro-tpm-attest; docs/attestation.md, "Cloud vTPMs: AWS NitroTPM"): a
// COSE_Sign1 (ES384) over a CBOR map naming the instance, its SHA-384 PCRs
// and the public key and nonce the requester chose, whose certificate
// chains to the AWS Nitro root. The document's public key must be the AK
// that signed the quote, its nonce the quote's extraData, and its PCRs the
// reference values: the hypervisor, not the AK, vouches for what the
// instance booted, and only the measured image asks for a document naming
// its TPM's AK.
type NitroEndorsement struct {
	// ReferenceValues are the SHA-384 PCR values (48 bytes each) the
	// document must show; at least one, never PCR 15 (the node lock,
	// checked in the quote's SHA-256 bank).
	ReferenceValues measurements.M
	// InstanceIDs, when set, are the admitted EC2 instance IDs (the
	// document's module_id, i-…).
	InstanceIDs []string
	// AnyInstance admits every NitroTPM instance of every AWS customer
	// whose document shows the reference values: the document names no
	// account. Exactly one of InstanceIDs and AnyInstance is set.
	AnyInstance bool
	// Roots, when set, replace the embedded AWS Nitro root (tests).
	Roots *x509.CertPool
	// AnyReferenceValues accepts any PCRs, with ReferenceValues empty:
	// only to capture reference values from a golden instance
	// (policy.Policy.KeyVerifier), never to admit one.
	AnyReferenceValues bool
}

func (e *NitroEndorsement) check() error {
	if e.AnyInstance == (len(e.InstanceIDs) > 0) {
		return errors.New("tpm policy: AWS NitroTPM needs exactly one of instance IDs and any-instance: " +
			"a NitroTPM document names no AWS account, so admitting every instance of every AWS customer must be said")
	}
	if (len(e.ReferenceValues) == 0) != e.AnyReferenceValues {
		return errors.New("tpm policy: AWS NitroTPM needs the SHA-384 reference values its documents must show (and only capturing takes any)")
	}
	for index, m := range e.ReferenceValues {
		if len(m.Expected) != nitroPCRSize {
			return fmt.Errorf("tpm policy: AWS NitroTPM reference value for PCR %d has %d bytes, want %d (SHA-384)", index, len(m.Expected), nitroPCRSize)
		}
	}
	return nil
}

func (e *NitroEndorsement) withEmbeddedRoot() (*NitroEndorsement, error) {
	out := *e
	if out.Roots != nil {
		return &out, nil
	}
	block, _ := pem.Decode(awsNitroRoot)
	if block == nil {
		return nil, errors.New("embedded AWS Nitro root: no PEM block")
	}
	root, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("embedded AWS Nitro root: %w", err)
	}
	if sum := sha256Hex(root.Raw); sum != awsNitroRootSHA256 {
		return nil, fmt.Errorf("embedded AWS Nitro root has fingerprint %s, want %s", sum, awsNitroRootSHA256)
	}
	out.Roots = x509.NewCertPool()
	out.Roots.AddCert(root)
	return &out, nil
}

// nitroDocument is the CBOR payload of a NitroTPM attestation document
// (the Nitro Enclaves attestation document's fields, with nitrotpm_pcrs
// for pcrs).
type nitroDocument struct {
	ModuleID    string            `cbor:"module_id"`
	Digest      string            `cbor:"digest"`
	Timestamp   uint64            `cbor:"timestamp"` // milliseconds since the Unix epoch
	PCRs        map[uint32][]byte `cbor:"nitrotpm_pcrs"`
	Certificate []byte            `cbor:"certificate"`
	CABundle    [][]byte          `cbor:"cabundle"`
	PublicKey   []byte            `cbor:"public_key"`
	UserData    []byte            `cbor:"user_data"`
	Nonce       []byte            `cbor:"nonce"`
}

// decodeNitroDocument decodes a document's payload, refusing duplicate
// keys and bounding the nesting and sizes of what a peer sends.
func decodeNitroDocument(payload []byte) (nitroDocument, error) {
	var doc nitroDocument
	mode, err := cbor.DecOptions{DupMapKey: cbor.DupMapKeyEnforcedAPF, MaxNestedLevels: 4, MaxArrayElements: 32, MaxMapPairs: 64}.DecMode()
	if err != nil {
		return doc, err
	}
	return doc, mode.Unmarshal(payload, &doc)
}

// verify checks document (a COSE_Sign1 NitroTPM attestation document) for
// the AK key and the quote's extraData, and returns its result: the
// document's SHA-384 PCRs as Measurements, the endorsement's description.
func (e *NitroEndorsement) verify(document []byte, key crypto.PublicKey, extraData []byte, v *QuoteVerifier) (*attestation.Result, error) {
	if len(document) == 0 {
		return nil, fmt.Errorf("%w: no NitroTPM attestation document with the evidence (is this an EC2 instance with NitroTPM?)", attestation.ErrUntrustedKey)
	}
	if len(document) > maxNitroDocument {
		return nil, fmt.Errorf("%w: NitroTPM document of %d bytes, at most %d", attestation.ErrMalformed, len(document), maxNitroDocument)
	}
	var msg cose.UntaggedSign1Message
	if err := msg.UnmarshalCBOR(document); err != nil {
		return nil, fmt.Errorf("%w: NitroTPM document is not a COSE_Sign1: %w", attestation.ErrMalformed, err)
	}
	doc, err := decodeNitroDocument(msg.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: NitroTPM document payload: %w", attestation.ErrMalformed, err)
	}
	leaf, err := e.chain(doc, v.now())
	if err != nil {
		return nil, err
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%w: NitroTPM document certificate holds a %T, want an ECDSA P-384 key", attestation.ErrUntrustedKey, leaf.PublicKey)
	}
	verifier, err := cose.NewVerifier(cose.AlgorithmES384, pub)
	if err != nil {
		return nil, fmt.Errorf("%w: NitroTPM document certificate: %w", attestation.ErrUntrustedKey, err)
	}
	if err := msg.Verify(nil, verifier); err != nil {
		return nil, fmt.Errorf("%w: NitroTPM document signature does not verify: %w", attestation.ErrSignature, err)
	}
	if doc.Digest != "SHA384" {
		return nil, fmt.Errorf("%w: NitroTPM document digest %q, want SHA384", attestation.ErrMalformed, doc.Digest)
	}
	if len(doc.PublicKey) > maxNitroField || len(doc.Nonce) > maxNitroField || len(doc.UserData) > maxNitroField {
		return nil, fmt.Errorf("%w: NitroTPM document field longer than %d bytes", attestation.ErrMalformed, maxNitroField)
	}
	if !nitroKeyMatches(doc.PublicKey, key) {
		return nil, fmt.Errorf("%w: the NitroTPM document names another public key than the AK that signed the quote", attestation.ErrUntrustedKey)
	}
	if !bytes.Equal(doc.Nonce, extraData) {
		return nil, fmt.Errorf("%w: the NitroTPM document's nonce is not the quote's binding: it was asked for another handshake", attestation.ErrNonce)
	}
	pcrs := make(map[uint32][]byte, len(doc.PCRs))
	for index, value := range doc.PCRs {
		if index > 23 || len(value) != nitroPCRSize {
			return nil, fmt.Errorf("%w: NitroTPM document PCR %d has %d bytes, want %d", attestation.ErrMalformed, index, len(value), nitroPCRSize)
		}
		pcrs[index] = value
	}
	if _, err := e.ReferenceValues.Compare(pcrs); err != nil && !e.AnyReferenceValues {
		return nil, fmt.Errorf("%w: NitroTPM document (SHA-384 PCRs): %w", attestation.ErrMeasurement, err)
	}
	// A NitroTPM's module_id is the instance ID and the TPM's:
	// i-01cfb383223e42522-tpm0000000000000000.
	instance, _, _ := strings.Cut(doc.ModuleID, "-tpm")
	if !e.AnyInstance && !slices.Contains(e.InstanceIDs, instance) {
		return nil, fmt.Errorf("%w: the NitroTPM document names instance %q, which the policy does not admit (awsNitroTPM.instanceIDs: %v)",
			attestation.ErrPolicy, instance, e.InstanceIDs)
	}
	at := time.UnixMilli(int64(min(doc.Timestamp, uint64(1)<<62))).UTC()
	return &attestation.Result{
		Variant:      attestation.VariantTPM,
		Identity:     attestation.PrefixAWSInstance + instance,
		Measurements: pcrs,
		Endorsement:  fmt.Sprintf("aws-nitrotpm instance=%s module=%s documentTime=%s", instance, doc.ModuleID, at.Format(time.RFC3339)),
	}, nil
}

// chain checks the document's certificate through its CA bundle (root
// first, as AWS orders it) to the roots at now, and returns the leaf.
func (e *NitroEndorsement) chain(doc nitroDocument, now time.Time) (*x509.Certificate, error) {
	leaf, err := x509.ParseCertificate(doc.Certificate)
	if err != nil {
		return nil, fmt.Errorf("%w: NitroTPM document certificate: %w", attestation.ErrMalformed, err)
	}
	intermediates := x509.NewCertPool()
	for i, der := range doc.CABundle {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%w: NitroTPM document cabundle[%d]: %w", attestation.ErrMalformed, i, err)
		}
		intermediates.AddCert(cert)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: e.Roots, Intermediates: intermediates, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("%w: NitroTPM document certificate does not chain to the AWS Nitro root: %w", attestation.ErrUntrustedKey, err)
	}
	return leaf, nil
}

// nitroKeyMatches reports whether a document's public_key names key: the
// uncompressed point of an ECDSA key (as the NitroTPM tools write it) or a
// DER SubjectPublicKeyInfo.
func nitroKeyMatches(named []byte, key crypto.PublicKey) bool {
	if ec, ok := key.(*ecdsa.PublicKey); ok {
		if point, err := ec.Bytes(); err == nil && bytes.Equal(point, named) {
			return true
		}
	}
	spki, err := x509.MarshalPKIXPublicKey(key)
	return err == nil && bytes.Equal(spki, named)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
