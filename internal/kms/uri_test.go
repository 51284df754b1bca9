package kms

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

func TestParseURI(t *testing.T) {
	secret, salt := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	good := ClusterKMSURIString(secret, salt)
	tests := []struct {
		name    string
		uri     string
		want    any
		wantErr string
	}{
		{name: "cluster-kms round trip", uri: good, want: &ClusterKMSURI{MasterSecret: secret, Salt: salt}},
		{
			name: "pkcs11",
			uri:  "kms://pkcs11?module=/usr/lib/softhsm/libsofthsm2.so&token=gatehouse&pin-source=file:/run/secrets/pin&key-label=kek",
			want: &PKCS11URI{Module: "/usr/lib/softhsm/libsofthsm2.so", Token: "gatehouse", PinSource: "file:/run/secrets/pin", KeyLabel: "kek"},
		},
		{name: "wrong scheme", uri: "https://cluster-kms?key=a&salt=b", wantErr: `scheme is "https", want kms`},
		{name: "unknown backend", uri: "kms://vault?x=1", wantErr: `unknown KMS backend "vault": known backends are cluster-kms, pkcs11`},
		{name: "missing salt", uri: "kms://cluster-kms?key=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", wantErr: `exactly one non-empty "salt"`},
		{name: "key not base64url", uri: "kms://cluster-kms?key=***&salt=AAAA", wantErr: `"key" is not base64url`},
		{name: "short key", uri: ClusterKMSURIString(make([]byte, 8), salt), wantErr: "key has 8 bytes, at least 16"},
		{name: "short salt", uri: ClusterKMSURIString(secret, make([]byte, 8)), wantErr: "salt has 8 bytes, at least 32"},
		{name: "unknown parameter", uri: good + "&colour=blue", wantErr: `unknown parameter "colour"`},
		{name: "repeated parameter", uri: good + "&key=AAAA", wantErr: `exactly one non-empty "key"`},
		{name: "pkcs11 relative module", uri: "kms://pkcs11?module=lib.so&token=t&pin-source=file:/p&key-label=k", wantErr: "not an absolute path"},
		{name: "pkcs11 PIN in URI", uri: "kms://pkcs11?module=/lib.so&token=t&pin-source=1234&key-label=k", wantErr: `pin-source must be "file:<absolute path>"`},
		{name: "path", uri: "kms://cluster-kms/x?key=a", wantErr: "has a path"},
		{name: "aws-kms without region", uri: "kms://aws-kms?key-id=alias/k", wantErr: `exactly one non-empty "region"`},
		{name: "aws-kms wrapped without salt", uri: "kms://aws-kms?key-id=k&region=r&wrapped=AQID", wantErr: `both "wrapped" and "salt"`},
		{name: "aws-kms short salt", uri: "kms://aws-kms?key-id=k&region=r&wrapped=AQID&salt=AQID", wantErr: "salt has 3 bytes"},
		{name: "aws-kms endpoint with credentials", uri: "kms://aws-kms?key-id=k&region=r&endpoint=https://u:p@kms.example", wantErr: "must not carry credentials"},
		{name: "aws-kms plain http endpoint", uri: "kms://aws-kms?key-id=k&region=r&endpoint=http://kms.example", wantErr: "plain http is allowed only to a loopback address"},
		{name: "vault token in URI", uri: "kms://vault-transit?address=https://v.example&key=k&token-source=hvs.x", wantErr: "a token never goes in the URI"},
		{name: "vault key with slash", uri: "kms://vault-transit?address=https://v.example&key=a/b&token-source=file:/t", wantErr: "Transit key name"},
		{name: "vault relative CA", uri: "kms://vault-transit?address=https://v.example&key=k&token-source=file:/t&ca-file=ca.pem", wantErr: "not an absolute path"},
		{name: "vault unknown parameter", uri: "kms://vault-transit?address=https://v.example&key=k&token-source=file:/t&token=x", wantErr: `unknown parameter "token"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseURI(tt.uri)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "AQEBAQEB") {
					t.Fatalf("error echoes key material: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch w := tt.want.(type) {
			case *ClusterKMSURI:
				g, ok := got.(*ClusterKMSURI)
				if !ok || !bytes.Equal(g.MasterSecret, w.MasterSecret) || !bytes.Equal(g.Salt, w.Salt) {
					t.Fatalf("got %#v", got)
				}
			case *PKCS11URI:
				if g, ok := got.(*PKCS11URI); !ok || *g != *w {
					t.Fatalf("got %#v, want %#v", got, w)
				}
			}
		})
	}
}

func FuzzParseURI(f *testing.F) {
	f.Add(ClusterKMSURIString(bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)))
	f.Add("kms://pkcs11?module=/usr/lib/softhsm/libsofthsm2.so&token=gatehouse&pin-source=file:/run/pin&key-label=kek")
	f.Add("kms://cluster-kms?key=%zz")
	f.Add((&AWSKMSURI{KeyID: "alias/k", Region: "eu-west-1", Endpoint: "http://127.0.0.1:1", WrappedSecret: WrappedSecret{Wrapped: []byte{1, 2}, Salt: bytes.Repeat([]byte{2}, 32)}}).String())
	f.Add((&VaultTransitURI{Address: "https://vault.example:8200", Mount: "secret/transit", Key: "k", TokenSource: "file:/t", CAFile: "/ca.pem"}).String())
	f.Fuzz(func(t *testing.T, uri string) {
		got, err := ParseURI(uri)
		if err != nil {
			return
		}
		if c, ok := got.(*ClusterKMSURI); ok && (len(c.MasterSecret) < keys.MinMasterSecretSize || len(c.Salt) < keys.MinMasterSaltSize) {
			t.Fatalf("accepted short key material from %q", uri)
		}
		if w, ok := External(got); ok {
			if w.IsWrapped() && (len(w.Salt) < keys.MinMasterSaltSize || len(w.Wrapped) > maxWrappedSize) {
				t.Fatalf("accepted a wrapped secret with a short salt or oversized ciphertext from %q", uri)
			}
			// What String renders parses back to the same URI.
			again, err := ParseURI(got.(fmt.Stringer).String())
			if err != nil || again.(fmt.Stringer).String() != got.(fmt.Stringer).String() {
				t.Fatalf("%q renders as a URI that does not parse back: %v", uri, err)
			}
		}
	})
}
