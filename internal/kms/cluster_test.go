package kms

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

var (
	katSecret = []byte("gatehouse test master secret 32b")
	katSalt   = []byte("gatehouse test master salt, 32 b")
)

// Known answers, computed once with crypto/hkdf and committed; the test also
// recomputes each with hkdfRFC5869 below, an independent implementation.
var kats = []struct {
	id     string
	length int
	want   string
}{
	{id: "measurementSecret", length: 32, want: "c6da3b8ba62f479dd45f68db3a004494047f1502277e9c1ff0c2eb28bea1caea"},
	{id: "clusterID", length: 32, want: "ed12074e1bb44736c7e34611e592e87b5c1d71ec4e9173ecfa3b870e3bfbce39"},
	{id: "2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", length: 32, want: "2429e480df9ebc75565cdea31d219ebda4d490d370a561ba52f8cd26db3a9677"},
	{id: "2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", length: 64, want: "2429e480df9ebc75565cdea31d219ebda4d490d370a561ba52f8cd26db3a9677fa4d3a582b73ef910ca0bc56012a9fcdaf9593f51a47acd5910ef69ee8b356c2"},
	{id: "a", length: 1, want: "41"},
}

// hkdfRFC5869 is HKDF-SHA256 written from RFC 5869 §2.2-2.3 with crypto/hmac
// only, to cross-check the derivation.
func hkdfRFC5869(ikm, salt, info []byte, length int) []byte {
	extract := hmac.New(sha256.New, salt)
	extract.Write(ikm)
	prk := extract.Sum(nil)
	var okm, t []byte
	for i := byte(1); len(okm) < length; i++ {
		expand := hmac.New(sha256.New, prk)
		expand.Write(t)
		expand.Write(info)
		expand.Write([]byte{i})
		t = expand.Sum(nil)
		okm = append(okm, t...)
	}
	return okm[:length]
}

func TestIndependentHKDFPassesRFC5869TestCase1(t *testing.T) {
	ikm, _ := hex.DecodeString("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b")
	salt, _ := hex.DecodeString("000102030405060708090a0b0c")
	info, _ := hex.DecodeString("f0f1f2f3f4f5f6f7f8f9")
	want := "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
	if got := hex.EncodeToString(hkdfRFC5869(ikm, salt, info, 42)); got != want {
		t.Fatalf("RFC 5869 A.1 OKM = %s, want %s", got, want)
	}
}

func TestClusterKMSKnownAnswers(t *testing.T) {
	k, err := NewClusterKMS(katSecret, katSalt)
	if err != nil {
		t.Fatal(err)
	}
	for _, kat := range kats {
		t.Run(kat.id, func(t *testing.T) {
			got, err := k.GetDataKey(context.Background(), kat.id, kat.length)
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != kat.want {
				t.Errorf("key = %x, want %s", got, kat.want)
			}
			if independent := hkdfRFC5869(katSecret, katSalt, []byte("key-"+kat.id), kat.length); hex.EncodeToString(independent) != kat.want {
				t.Errorf("independent HKDF = %x, want %s", independent, kat.want)
			}
		})
	}
}

func TestNewClusterKMSEnforcesMinimumSizes(t *testing.T) {
	if _, err := NewClusterKMS(make([]byte, 15), make([]byte, 32)); err == nil || !strings.Contains(err.Error(), "master secret has 15 bytes, at least 16") {
		t.Errorf("short secret: %v", err)
	}
	if _, err := NewClusterKMS(make([]byte, 16), make([]byte, 31)); err == nil || !strings.Contains(err.Error(), "master salt has 31 bytes, at least 32") {
		t.Errorf("short salt: %v", err)
	}
}

// FuzzGetDataKey sends arbitrary ids and lengths, as a key service request may
// carry: the answer is a key of exactly the requested length or an error
// wrapping keys.ErrInvalidRequest, never a panic.
func FuzzGetDataKey(f *testing.F) {
	f.Add("2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", 32)
	f.Add("", 0)
	f.Add("../x", 65)
	f.Add("a", -1)
	k, err := NewClusterKMS(katSecret, katSalt)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id string, length int) {
		key, err := k.GetDataKey(context.Background(), id, length)
		if err != nil {
			if !errors.Is(err, keys.ErrInvalidRequest) {
				t.Fatalf("error %v does not wrap keys.ErrInvalidRequest", err)
			}
			return
		}
		if len(key) != length {
			t.Fatalf("key has %d bytes, want %d", len(key), length)
		}
	})
}
