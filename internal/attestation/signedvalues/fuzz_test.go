package signedvalues

import (
	"bytes"
	"context"
	"testing"
)

// FuzzVerify feeds arbitrary files to Verify: it must never panic, and a
// file it accepts must carry values that sign and verify again unchanged.
func FuzzVerify(f *testing.F) {
	key := ed25519Key(1)
	signed, err := Sign(context.Background(), testValues(), key)
	if err != nil {
		f.Fatal(err)
	}
	payload, err := testValues().Payload()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(signed)
	f.Add(payload)
	f.Add([]byte(`{"payloadType":"application/vnd.gatehouse.reference-values+json","payload":"","signatures":[]}`))
	f.Add([]byte("4: {expected: \"00\"}\n"))
	f.Add([]byte(`{"payloadType":1,"payload":{},"signatures":[{"keyid":null,"sig":"AA=="}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Verify(context.Background(), data, key.Public())
		if err != nil {
			return
		}
		again, err := Sign(context.Background(), v, key)
		if err != nil {
			t.Fatalf("accepted values do not sign again: %v", err)
		}
		w, err := Verify(context.Background(), again, key.Public())
		if err != nil {
			t.Fatalf("accepted values, signed again, do not verify: %v", err)
		}
		p1, _ := v.Payload()
		p2, _ := w.Payload()
		if !bytes.Equal(p1, p2) {
			t.Fatalf("values changed in a sign-verify round trip:\n%s\n%s", p1, p2)
		}
	})
}

// FuzzParsePayload feeds arbitrary unsigned payloads (YAML or JSON) to
// ParsePayload: it must never panic, and an accepted payload must encode.
func FuzzParsePayload(f *testing.F) {
	payload, err := testValues().Payload()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(payload)
	f.Add([]byte("apiVersion: gatehouse.dev/v1\nkind: ReferenceValues\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ParsePayload(data)
		if err != nil {
			return
		}
		if _, err := v.Payload(); err != nil {
			t.Fatalf("an accepted payload does not encode: %v", err)
		}
	})
}
