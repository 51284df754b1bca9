package cosignformat

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

func newSigner(t *testing.T) (*Signer, *Verifier) {
	t.Helper()
	priv, pub, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := LoadSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	v, err := LoadVerifier(pub)
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

func TestBlob(t *testing.T) {
	s, v := newSigner(t)
	_, other := newSigner(t)
	sig, err := s.SignBlob(strings.NewReader("artifact"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.SignBlob(strings.NewReader("artifact"))
	if err != nil {
		t.Fatal(err)
	}
	if string(sig) != string(again) {
		t.Errorf("Ed25519 signatures differ for the same blob: %s, %s", sig, again)
	}
	tests := []struct {
		name    string
		v       *Verifier
		blob    string
		sig     []byte
		wantErr bool
	}{
		{"signed blob verifies", v, "artifact", sig, false},
		{"a trailing newline in the .sig file is ignored", v, "artifact", append(append([]byte(nil), sig...), '\n'), false},
		{"changed blob is refused", v, "artifacT", sig, true},
		{"wrong key is refused", other, "artifact", sig, true},
		{"garbage signature is refused", v, "artifact", []byte("not base64!"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.v.VerifyBlob(strings.NewReader(tt.blob), tt.sig)
			if tt.wantErr != (err != nil) || (err != nil && !errors.Is(err, errBadSignature)) {
				t.Errorf("VerifyBlob = %v, want error %t wrapping errBadSignature", err, tt.wantErr)
			}
		})
	}
}

func TestLoadSignerRefusesRandomizedKeys(t *testing.T) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pemBytes, err := cryptoutils.MarshalPrivateKeyToPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	_, err = LoadSigner(pemBytes)
	if err == nil || !strings.Contains(err.Error(), "an Ed25519 key is needed") {
		t.Fatalf("LoadSigner(ECDSA) = %v, want the Ed25519 refusal", err)
	}
	_, err = LoadSigner([]byte("-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"))
	if err == nil || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Fatalf("LoadSigner(bad PEM) = %v: want an error without the key's bytes", err)
	}
}

// The payload is byte for byte what cosign signs (its
// pkg/cosign/payload tests and SIGNATURE_SPEC.md).
func TestPayload(t *testing.T) {
	got, err := payload("ghcr.io/gatehouse-dev/gatehouse-joinservice", "sha256:"+strings.Repeat("ab", 32))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"critical":{"identity":{"docker-reference":"ghcr.io/gatehouse-dev/gatehouse-joinservice"},"image":{"docker-manifest-digest":"sha256:` +
		strings.Repeat("ab", 32) + `"},"type":"cosign container image signature"},"optional":null}`
	if string(got) != want {
		t.Errorf("Payload =\n%s\nwant\n%s", got, want)
	}
}

func TestImage(t *testing.T) {
	s, v := newSigner(t)
	_, other := newSigner(t)
	const repo = "ghcr.io/gatehouse-dev/gatehouse-joinservice"
	d := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("12", 32)}
	sig, err := s.SignImage(repo, d)
	if err != nil {
		t.Fatal(err)
	}
	if got := SignatureTag(d); got != "sha256-"+d.Hex+".sig" {
		t.Errorf("SignatureTag = %s", got)
	}
	m, err := sig.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != simpleSigningMediaType || m.Layers[0].Annotations[signatureAnnotation] == "" {
		t.Fatalf("signature manifest %+v: want one simple-signing layer with %s", m, signatureAnnotation)
	}
	tests := []struct {
		name    string
		v       *Verifier
		repo    string
		digest  v1.Hash
		wantErr bool
	}{
		{"signature verifies", v, repo, d, false},
		{"another digest is refused", v, repo, v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("34", 32)}, true},
		{"another repository is refused", v, "ghcr.io/evil/gatehouse-joinservice", d, true},
		{"wrong key is refused", other, repo, d, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.v.VerifyImage(sig, tt.repo, tt.digest)
			if tt.wantErr != (err != nil) || (err != nil && !errors.Is(err, errNoImageSignature)) {
				t.Errorf("VerifyImage = %v, want error %t wrapping errNoImageSignature", err, tt.wantErr)
			}
		})
	}
}
