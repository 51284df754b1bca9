package cosignformat

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// decode is the signature a .sig file holds, as VerifyBlob reads it.
func decode(t *testing.T, sigFile []byte) []byte {
	t.Helper()
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(sigFile)))
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// FuzzVerifyBlob: a .sig file comes with a downloaded release. Any bytes
// are refused as a bad signature without a panic, unless they are the
// signature the key made.
func FuzzVerifyBlob(f *testing.F) {
	priv, pub, err := GenerateKey()
	if err != nil {
		f.Fatal(err)
	}
	s, err := LoadSigner(priv)
	if err != nil {
		f.Fatal(err)
	}
	v, err := LoadVerifier(pub)
	if err != nil {
		f.Fatal(err)
	}
	blob := []byte("SHA256SUMS")
	good, err := s.SignBlob(bytes.NewReader(blob))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("not base64!"))
	f.Add([]byte(" \n"))
	f.Fuzz(func(t *testing.T, sig []byte) {
		err := v.VerifyBlob(bytes.NewReader(blob), sig)
		if err != nil && !errors.Is(err, errBadSignature) {
			t.Fatalf("VerifyBlob = %v, not a bad signature", err)
		}
		if err == nil && !bytes.Equal(decode(t, sig), decode(t, good)) {
			// Ed25519 signatures are unique for a key and message (RFC 8032).
			t.Fatalf("a signature other than the key's verified: %q", sig)
		}
	})
}

// FuzzParsePayload: an image signature's payload comes from a registry
// or an archive. Parsing never panics and accepts only cosign's type.
func FuzzParsePayload(f *testing.F) {
	p, err := payload("ghcr.io/gatehouse-dev/gatehouse-joinservice", "sha256:"+string(bytes.Repeat([]byte("a"), 64)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(p)
	f.Add([]byte(`{"critical":{"type":"other"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parsePayload(data)
		if err == nil && got.Critical.Type != simpleSigningType {
			t.Fatalf("accepted the type %q", got.Critical.Type)
		}
	})
}
