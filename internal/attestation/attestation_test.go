package attestation

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/asn1"
	"errors"
	"strings"
	"testing"
)

// TestOIDsAreStable pins every variant's OID: they are on the wire in every
// attested certificate, so changing one breaks every deployed peer.
func TestOIDsAreStable(t *testing.T) {
	tests := []struct {
		variant Variant
		want    string
	}{
		{VariantTPM, "1.3.9903.1.1"},
		{VariantSNP, "1.3.9903.1.2"},
		{VariantTDX, "1.3.9903.1.3"},
		{VariantAzureSNP, "1.3.9903.1.4"},
	}
	for _, tt := range tests {
		t.Run(string(tt.variant), func(t *testing.T) {
			oid, err := tt.variant.OID()
			if err != nil {
				t.Fatal(err)
			}
			if oid.String() != tt.want {
				t.Errorf("OID = %s, want %s", oid, tt.want)
			}
			back, ok := VariantForOID(oid)
			if !ok || back != tt.variant {
				t.Errorf("VariantForOID(%s) = %q, %t", oid, back, ok)
			}
			if !InArc(oid) {
				t.Errorf("%s not in the arc", oid)
			}
		})
	}
}

func TestUnknownVariants(t *testing.T) {
	if _, err := ParseVariant("sgx"); err == nil || !strings.Contains(err.Error(), "known variants are azure-sev-snp, sev-snp, tdx, tpm") {
		t.Fatalf("error = %v", err)
	}
	if _, err := Variant("sgx").OID(); err == nil {
		t.Fatal("OID of an unknown variant")
	}
	for _, oid := range []asn1.ObjectIdentifier{{1, 3, 9903, 1, 99}, {1, 3, 9903, 1}, {1, 3, 9900, 1, 1}, {2, 23, 133, 5, 4, 9}} {
		if v, ok := VariantForOID(oid); ok {
			t.Errorf("VariantForOID(%s) = %s", oid, v)
		}
	}
	if !InArc(asn1.ObjectIdentifier{1, 3, 9903, 1, 99}) || InArc(asn1.ObjectIdentifier{1, 3, 9903, 1}) {
		t.Error("InArc is wrong about the arc's edge")
	}
}

func TestBindings(t *testing.T) {
	nonce := bytes.Repeat([]byte{1}, NonceSize)
	user := []byte("user")
	want256 := sha256.Sum256(append(append([]byte{}, nonce...), user...))
	want512 := sha512.Sum512(append(append([]byte{}, nonce...), user...))
	if !bytes.Equal(Binding256(nonce, user), want256[:]) || !bytes.Equal(Binding512(nonce, user), want512[:]) {
		t.Fatal("bindings are not the hash of nonce || user data")
	}
	if err := CheckNonce(nonce[:31]); !errors.Is(err, ErrNonce) {
		t.Fatalf("error = %v", err)
	}
}
