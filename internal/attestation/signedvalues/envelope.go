package signedvalues

import (
	"bytes"
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// ErrUnsigned is wrapped by Verify's error when the file is not a signed
// reference-value file but plain reference values or an unsigned payload:
// values nobody vouches for.
var ErrUnsigned = errors.New("the file is not signed")

var (
	errNotEnvelope  = errors.New("not a signed reference-value file (a DSSE envelope)")
	errPayloadType  = errors.New("wrong payload type")
	errNoSignature  = errors.New("the envelope carries no signature")
	errWrongKey     = errors.New("not signed by the verify key")
	errBadSignature = errors.New("the signature does not verify")
	errNotCanonical = errors.New("the payload is not canonical JSON")
	errTooLarge     = errors.New("file too large")
)

var (
	envelopeFields  = []string{"payloadType", "payload", "signatures"}
	signatureFields = []string{"keyid", "sig"}
)

// Sign validates v and returns the signed reference-value file: a DSSE
// envelope (JSON, indented) over v's canonical payload, signed by key
// (Ed25519 or ECDSA P-256; see ParsePrivateKey) with its KeyID.
func Sign(ctx context.Context, v Values, key crypto.Signer) ([]byte, error) {
	if err := checkAlgorithm(key.Public()); err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	payload, err := v.Payload()
	if err != nil {
		return nil, err
	}
	keyID, err := KeyID(key.Public())
	if err != nil {
		return nil, err
	}
	signer, err := dsse.NewEnvelopeSigner(dsseSigner{key: key, keyID: keyID})
	if err != nil {
		return nil, err
	}
	env, err := signer.SignPayload(ctx, payloadType, payload)
	if err != nil {
		return nil, fmt.Errorf("signing reference values: %w", err)
	}
	out, err := json.MarshalIndent(env, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// Verify checks a signed reference-value file against the public key pub
// and returns its values. It refuses, with an error naming what is wrong
// and what to do: a file over 4 MiB; anything but a DSSE envelope with
// exactly the fields payloadType, payload and signatures (plain reference
// values and unsigned payloads wrap ErrUnsigned); another payload type; an
// envelope without signatures; one whose signatures are all by other keys;
// a signature by pub that does not verify (the payload or its type was
// changed); a payload that is not canonical JSON or not a valid payload
// (unknown fields, wrongly sized values; see ParsePayload).
func Verify(ctx context.Context, data []byte, pub crypto.PublicKey) (Values, error) {
	if len(data) > maxFileSize {
		return Values{}, fmt.Errorf("%w: %d bytes, at most %d allowed", errTooLarge, len(data), maxFileSize)
	}
	if err := checkAlgorithm(pub); err != nil {
		return Values{}, fmt.Errorf("verify key: %w", err)
	}
	env, err := parseEnvelope(data)
	if err != nil {
		return Values{}, err
	}
	if env.PayloadType != payloadType {
		return Values{}, fmt.Errorf("%w: payloadType %q, want %q: the envelope signs something else; use the reference-value file of an image build",
			errPayloadType, env.PayloadType, payloadType)
	}
	if len(env.Signatures) == 0 {
		return Values{}, fmt.Errorf("%w: %w; sign it with gatehouse image sign-values", ErrUnsigned, errNoSignature)
	}
	keyID, err := KeyID(pub)
	if err != nil {
		return Values{}, err
	}
	var others []string
	for _, s := range env.Signatures {
		if s.KeyID != keyID && s.KeyID != "" {
			others = append(others, s.KeyID)
		}
	}
	if len(others) == len(env.Signatures) {
		return Values{}, fmt.Errorf("%w: signed by key %s, the verify key is %s: pass the public key of the build's signing key to --verify-key, "+
			"or refuse the file if you do not trust its signer", errWrongKey, strings.Join(others, ", "), keyID)
	}
	verifier, err := dsse.NewEnvelopeVerifier(dsseVerifier{pub: pub, keyID: keyID})
	if err != nil {
		return Values{}, err
	}
	_, payload, err := verifier.VerifyAndDecode(ctx, env)
	if err != nil {
		return Values{}, fmt.Errorf("%w (key %s): the payload or its type was changed after signing (%w); take the file from the build again",
			errBadSignature, keyID, err)
	}
	v, err := parsePayloadJSON(payload)
	if err != nil {
		return Values{}, err
	}
	canonical, err := v.Payload()
	if err != nil {
		return Values{}, err
	}
	if !bytes.Equal(canonical, payload) {
		return Values{}, fmt.Errorf("%w: its signer wrote it differently than gatehouse image sign-values does (duplicate, reordered or differently "+
			"spelt fields); sign the values with gatehouse image sign-values", errNotCanonical)
	}
	return v, nil
}

// parseEnvelope decodes a DSSE envelope strictly: one JSON object with
// exactly its three fields, signatures with exactly keyid and sig. Plain
// reference values and unsigned payloads are told apart, wrapping
// ErrUnsigned.
func parseEnvelope(data []byte) (*dsse.Envelope, error) {
	var fields map[string]json.RawMessage
	err := decodeOne(data, &fields)
	if err == nil && fields == nil {
		err = errors.New("null")
	}
	if err != nil {
		if _, perr := measurements.Parse(data, 0); perr == nil {
			return nil, fmt.Errorf("%w: %w: it holds plain reference values", errNotEnvelope, ErrUnsigned)
		}
		if _, perr := ParsePayload(data); perr == nil {
			return nil, fmt.Errorf("%w: %w: it is an unsigned reference-value payload; sign it with gatehouse image sign-values", errNotEnvelope, ErrUnsigned)
		}
		return nil, fmt.Errorf("%w: want one JSON object {payloadType, payload, signatures}: %w", errNotEnvelope, err)
	}
	if _, ok := fields["payloadType"]; !ok {
		if _, ok := fields["apiVersion"]; ok {
			return nil, fmt.Errorf("%w: %w: it is an unsigned reference-value payload; sign it with gatehouse image sign-values", errNotEnvelope, ErrUnsigned)
		}
		if _, err := measurements.Parse(data, 0); err == nil {
			return nil, fmt.Errorf("%w: %w: it holds plain reference values", errNotEnvelope, ErrUnsigned)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(envelopeFields, name) {
			return nil, fmt.Errorf("%w: unknown field %q (known: %v)", errNotEnvelope, name, envelopeFields)
		}
	}
	for _, name := range envelopeFields {
		if _, ok := fields[name]; !ok {
			return nil, fmt.Errorf("%w: field %q is missing", errNotEnvelope, name)
		}
	}
	var env dsse.Envelope
	if err := json.Unmarshal(fields["payloadType"], &env.PayloadType); err != nil {
		return nil, fmt.Errorf("%w: payloadType: %w", errNotEnvelope, err)
	}
	if err := json.Unmarshal(fields["payload"], &env.Payload); err != nil {
		return nil, fmt.Errorf("%w: payload: %w", errNotEnvelope, err)
	}
	var sigs []map[string]json.RawMessage
	if err := json.Unmarshal(fields["signatures"], &sigs); err != nil {
		return nil, fmt.Errorf("%w: signatures: %w", errNotEnvelope, err)
	}
	for i, s := range sigs {
		for _, name := range slices.Sorted(maps.Keys(s)) {
			if !slices.Contains(signatureFields, name) {
				return nil, fmt.Errorf("%w: signatures[%d]: unknown field %q (known: %v)", errNotEnvelope, i, name, signatureFields)
			}
		}
		var sig dsse.Signature
		if err := json.Unmarshal(s["keyid"], &sig.KeyID); s["keyid"] != nil && err != nil {
			return nil, fmt.Errorf("%w: signatures[%d].keyid: %w", errNotEnvelope, i, err)
		}
		if err := json.Unmarshal(s["sig"], &sig.Sig); err != nil || sig.Sig == "" {
			return nil, fmt.Errorf("%w: signatures[%d].sig: want a base64 signature", errNotEnvelope, i)
		}
		env.Signatures = append(env.Signatures, sig)
	}
	return &env, nil
}

// decodeOne decodes exactly one JSON value from data into v; trailing
// data is an error.
func decodeOne(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}
