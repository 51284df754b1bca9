package signedvalues

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
)

// digest returns a 32-byte test value derived from s.
func digest(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// testValues are the values of a two-role image: PCR 9 shared, PCRs 4 and
// 11 per role.
func testValues() Values {
	role := func(name string) measurements.M {
		return measurements.M{
			4: {Expected: digest("pcr4 " + name), Events: []measurements.Event{
				{Type: "EV_EFI_ACTION", Description: "Calling EFI Application from Boot Option", Digest: digest("action"), Source: "platform qemu-ovmf"},
				{Type: "EV_EFI_BOOT_SERVICES_APPLICATION", Description: "uki-" + name + ".efi", Digest: digest("uki " + name), Source: "uki-" + name + ".efi Authenticode"},
			}},
			9:  {Expected: digest("pcr9"), Events: []measurements.Event{{Type: "EV_EVENT_TAG", Description: "Linux initrd", Digest: digest("initrd"), Source: "uki-" + name + ".efi section .initrd"}}},
			11: {Expected: digest("pcr11 " + name)},
			12: {Expected: make([]byte, 32)},
		}
	}
	return Values{
		Platform: "qemu-ovmf",
		Image:    Image{Name: "gatehouse-node", Version: "v0.1.0", ManifestSHA256: strings.Repeat("ab", 32), RootHash: strings.Repeat("cd", 32)},
		Roles:    map[policy.Role]measurements.M{policy.RoleControlPlane: role("controlplane"), policy.RoleWorker: role("worker")},
		Notes:    []string{"PCRs 0-3 and 7 are not predicted: platform qemu-ovmf has no measured values"},
	}
}

// ed25519Key returns a deterministic Ed25519 key for seed.
func ed25519Key(seed byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
}

// signRaw signs payload under typ with key as a signer with any payload
// would: the attacker's (or another tool's) envelope.
func signRaw(t *testing.T, typ string, payload []byte, key crypto.Signer) []byte {
	t.Helper()
	id, err := KeyID(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	s, err := dsse.NewEnvelopeSigner(dsseSigner{key: key, keyID: id})
	if err != nil {
		t.Fatal(err)
	}
	env, err := s.SignPayload(context.Background(), typ, payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// editEnvelope decodes a signed file, applies edit, and encodes it again.
func editEnvelope(t *testing.T, data []byte, edit func(e *dsse.Envelope)) []byte {
	t.Helper()
	var e dsse.Envelope
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatal(err)
	}
	edit(&e)
	out, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSignVerifyRoundTrip(t *testing.T) {
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range map[string]crypto.Signer{"ed25519": ed25519Key(1), "ecdsa p-256": ecKey} {
		t.Run(name, func(t *testing.T) {
			want := testValues()
			signed, err := Sign(t.Context(), want, key)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Verify(t.Context(), signed, key.Public())
			if err != nil {
				t.Fatal(err)
			}
			wantPayload, _ := want.Payload()
			gotPayload, err := got.Payload()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(wantPayload, gotPayload) {
				t.Errorf("payload changed in the round trip:\n got %s\nwant %s", gotPayload, wantPayload)
			}
			if got.Roles[policy.RoleWorker][4].Events[1].Source != "uki-worker.efi Authenticode" {
				t.Errorf("events lost their source: %+v", got.Roles[policy.RoleWorker][4].Events)
			}
		})
	}
}

func TestPayloadIsCanonicalJSON(t *testing.T) {
	payload, err := testValues().Payload()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"apiVersion":"gatehouse.dev/v1","image":{`, `"kind":"ReferenceValues"`, `"variant":"tpm"`, `"platform":"qemu-ovmf"`,
		`"roles":{"controlPlane":{"11":{"expected":"`, `"12":{"expected":"0000000000000000000000000000000000000000000000000000000000000000","warnOnly":false}`} {
		if !strings.Contains(string(payload), want) {
			t.Errorf("payload lacks %s:\n%s", want, payload)
		}
	}
	again, err := ParsePayload(payload)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := again.Payload(); !bytes.Equal(p, payload) {
		t.Error("parsing and encoding the payload again changed it")
	}
}

func TestVerifyRefuses(t *testing.T) {
	key, other := ed25519Key(1), ed25519Key(2)
	signed, err := Sign(context.Background(), testValues(), key)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := testValues().Payload()
	if err != nil {
		t.Fatal(err)
	}
	plain, err := testValues().Roles[policy.RoleWorker].Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// resigned signs an edited payload with the trusted key: what a payload
	// the trusted signer wrote wrongly looks like.
	resigned := func(edit func(string) string) []byte {
		return signRaw(t, payloadType, []byte(edit(string(payload))), key)
	}
	tests := []struct {
		name    string
		data    []byte
		wantErr error
		wantMsg string
	}{
		{"an altered byte in the payload", editEnvelope(t, signed, func(e *dsse.Envelope) {
			body, _ := base64.StdEncoding.DecodeString(e.Payload)
			body = bytes.Replace(body, []byte("gatehouse-node"), []byte("gatehouse-nodf"), 1)
			e.Payload = base64.StdEncoding.EncodeToString(body)
		}), errBadSignature, "changed after signing"},
		{"a swapped payload type", editEnvelope(t, signed, func(e *dsse.Envelope) { e.PayloadType = "application/vnd.in-toto+json" }), errPayloadType, "application/vnd.in-toto+json"},
		{"the payload re-signed under another type by the trusted key", signRaw(t, "application/vnd.in-toto+json", payload, key), errPayloadType, "want \"" + payloadType},
		{"a signature by another key", signRaw(t, payloadType, payload, other), errWrongKey, "the verify key is"},
		{"a signature by another key under the trusted key's id", editEnvelope(t, signRaw(t, payloadType, payload, other), func(e *dsse.Envelope) {
			e.Signatures[0].KeyID, _ = KeyID(key.Public())
		}), errBadSignature, ""},
		{"no signature", editEnvelope(t, signed, func(e *dsse.Envelope) { e.Signatures = nil }), errNoSignature, "gatehouse image sign-values"},
		{"plain reference values", plain, ErrUnsigned, "plain reference values"},
		{"an unsigned payload", payload, ErrUnsigned, "sign it with gatehouse image sign-values"},
		{"an unknown envelope field", bytes.Replace(signed, []byte(`"payloadType"`), []byte(`"extra": 1, "payloadType"`), 1), errNotEnvelope, `unknown field "extra"`},
		{"an unknown signature field", bytes.Replace(signed, []byte(`"keyid"`), []byte(`"cert": "x", "keyid"`), 1), errNotEnvelope, `unknown field "cert"`},
		{"a misspelt envelope field", bytes.Replace(signed, []byte(`"payloadType"`), []byte(`"PayloadType"`), 1), errNotEnvelope, `"PayloadType"`},
		{"trailing data", append(bytes.Clone(signed), []byte("{}")...), errNotEnvelope, ""},
		{"an oversize file", append(bytes.Clone(signed), bytes.Repeat([]byte(" "), maxFileSize)...), errTooLarge, "at most"},
		{"an unknown payload field, signed", resigned(func(s string) string { return strings.Replace(s, `"apiVersion"`, `"annotations":{},"apiVersion"`, 1) }), nil, `unknown field "annotations"`},
		{"an unknown image field, signed", resigned(func(s string) string { return strings.Replace(s, `"image":{`, `"image":{"digest":"x",`, 1) }), nil, `unknown field "digest"`},
		{"an unknown measurement field, signed", resigned(func(s string) string {
			return strings.Replace(s, `"warnOnly":false`, `"warnOnly":false,"optional":true`, 1)
		}), nil, `unknown field "optional"`},
		{"a 31-byte value, signed", resigned(func(s string) string { return strings.Replace(s, `"expected":"00000000`, `"expected":"000000`, 1) }), nil, "has 31 bytes, want 32"},
		{"a non-canonical payload, signed", resigned(func(s string) string { return strings.Replace(s, `"kind":`, `"kind": `, 1) }), errNotCanonical, "sign the values with gatehouse image sign-values"},
		{"a duplicate key, signed", resigned(func(s string) string {
			return strings.Replace(s, `"platform":"qemu-ovmf"`, `"platform":"qemu-ovmf","platform":"qemu-ovmf"`, 1)
		}), errNotCanonical, ""},
		{"the node-lock PCR, signed", resigned(func(s string) string { return strings.Replace(s, `"12":{`, `"15":{`, 2) }), nil, "node lock"},
		{"another variant, signed", resigned(func(s string) string { return strings.Replace(s, `"variant":"tpm"`, `"variant":"sev-snp"`, 1) }), nil, `variant "sev-snp"`},
		{"an unknown role, signed", resigned(func(s string) string { return strings.Replace(s, `"worker":`, `"etcd":`, 1) }), nil, "roles.etcd: unknown role"},
		{"not JSON at all", []byte("\x00\x01garbage"), errNotEnvelope, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Verify(t.Context(), tt.data, key.Public())
			if err == nil {
				t.Fatal("Verify accepted the file")
			}
			t.Log(err)
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %q, want %q", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
}

func TestSignRefusesInvalidValues(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(v *Values)
		wantMsg string
	}{
		{"the node-lock PCR", func(v *Values) { v.Roles[policy.RoleWorker][15] = measurements.Measurement{Expected: make([]byte, 32)} }, "node lock"},
		{"PCR 24", func(v *Values) { v.Roles[policy.RoleWorker][24] = measurements.Measurement{Expected: make([]byte, 32)} }, "PCR 24 does not exist"},
		{"a 48-byte value", func(v *Values) { v.Roles[policy.RoleWorker][4] = measurements.Measurement{Expected: make([]byte, 48)} }, "has 48 bytes, want 32"},
		{"no roles", func(v *Values) { v.Roles = nil }, "roles is empty"},
		{"an empty role", func(v *Values) { v.Roles[policy.RoleWorker] = measurements.M{} }, "roles.worker has no reference values"},
		{"a bad root hash", func(v *Values) { v.Image.RootHash = "ABC" }, "image.rootHash"},
		{"a platform name with spaces", func(v *Values) { v.Platform = "qemu ovmf" }, `platform "qemu ovmf"`},
		{"a control character in a note", func(v *Values) { v.Notes = []string{"a\nb"} }, "notes[0] has a control character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := testValues()
			tt.edit(&v)
			_, err := Sign(t.Context(), v, ed25519Key(1))
			if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Sign error %v, want one saying %q", err, tt.wantMsg)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	privPEM, pubPEM, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key, err := ParsePrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ParsePublicKey(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pubPEM)
	sum := sha256.Sum256(block.Bytes)
	if id, _ := KeyID(pub); id != hex.EncodeToString(sum[:]) {
		t.Errorf("KeyID %s is not the hex SHA-256 of the PKIX DER", id)
	}
	signed, err := Sign(t.Context(), testValues(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(t.Context(), signed, pub); err != nil {
		t.Fatal(err)
	}

	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sec1, _ := x509.MarshalECPrivateKey(ecKey)
	if _, err := ParsePrivateKey(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})); err != nil {
		t.Errorf("SEC 1 P-256 key refused: %v", err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384DER, _ := x509.MarshalPKCS8PrivateKey(p384)
	p384Pub, _ := x509.MarshalPKIXPublicKey(p384.Public())
	refusals := []struct {
		name    string
		parse   func() error
		wantMsg string
	}{
		{"a P-384 private key", func() error {
			_, err := ParsePrivateKey(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p384DER}))
			return err
		}, "only P-256"},
		{"a P-384 public key", func() error {
			_, err := ParsePublicKey(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: p384Pub}))
			return err
		}, "only P-256"},
		{"the private key as verify key", func() error { _, err := ParsePublicKey(privPEM); return err }, "never pass the private key"},
		{"no PEM", func() error { _, err := ParsePrivateKey([]byte("not a key")); return err }, "no PEM block"},
		{"a corrupt private key", func() error {
			_, err := ParsePrivateKey(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("junk")}))
			return err
		}, "does not hold a valid"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.parse()
			if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %v, want one saying %q", err, tt.wantMsg)
			}
			if err != nil && strings.Contains(err.Error(), string(privPEM[30:50])) {
				t.Error("the error contains key material")
			}
		})
	}
}

func TestSplit(t *testing.T) {
	v := testValues()
	common, roles := v.Split()
	if got := common.Indices(); len(got) != 2 || got[0] != 9 || got[1] != 12 {
		t.Errorf("common PCRs %v, want [9 12] (equal on both roles; an event's source may differ)", got)
	}
	for _, r := range []policy.Role{policy.RoleControlPlane, policy.RoleWorker} {
		if got := roles[r].Indices(); len(got) != 2 || got[0] != 4 || got[1] != 11 {
			t.Errorf("%s PCRs %v, want [4 11]", r, got)
		}
	}
	delete(v.Roles, policy.RoleControlPlane)
	common, roles = v.Split()
	if len(common) != 4 || len(roles[policy.RoleWorker]) != 4 {
		t.Errorf("one role: common %v, worker %v; want every PCR in both", common.Indices(), roles[policy.RoleWorker].Indices())
	}
}
