package bootstraptoken

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// memSecrets is kube-system in memory, with the API server's errors.
type memSecrets map[string]*corev1.Secret

var secretsResource = schema.GroupResource{Resource: "secrets"}

func (m memSecrets) Create(_ context.Context, s *corev1.Secret) error {
	if _, ok := m[s.Name]; ok {
		return apierrors.NewAlreadyExists(secretsResource, s.Name)
	}
	m[s.Name] = s.DeepCopy()
	return nil
}

func (m memSecrets) Get(_ context.Context, name string) (*corev1.Secret, error) {
	s, ok := m[name]
	if !ok {
		return nil, apierrors.NewNotFound(secretsResource, name)
	}
	return s.DeepCopy(), nil
}

var testIssuer = Issuer{Label: "example.com/owner", IDDomain: "test-id", OwnerDomain: "test-owner"}

func TestIssuerEnsure(t *testing.T) {
	exp := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	const key = "owner-a"
	tests := []struct {
		name string
		// before puts Secrets in place; it returns the token a reuse hands
		// back, if any.
		before       func(t *testing.T, m memSecrets) Token
		wantExisting bool
		wantErr      error
	}{
		{name: "created", before: func(*testing.T, memSecrets) Token { return Token{} }},
		{name: "reused", wantExisting: true, before: func(t *testing.T, m memSecrets) Token {
			tok, s, err := testIssuer.NewSecret(key, exp.Add(-time.Hour), "earlier")
			if err != nil {
				t.Fatal(err)
			}
			m[s.Name] = s
			return tok
		}},
		{name: "id taken by another owner", wantErr: ErrIDTaken, before: func(t *testing.T, m memSecrets) Token {
			tok, err := New(testIssuer.ID(key), exp)
			if err != nil {
				t.Fatal(err)
			}
			s := Secret(tok, map[string]string{testIssuer.Label: testIssuer.OwnerLabel("owner-b")}, "kubeadm token create")
			m[s.Name] = s
			return Token{}
		}},
		{name: "unlabelled token of kubeadm", wantErr: ErrIDTaken, before: func(t *testing.T, m memSecrets) Token {
			tok, err := New(testIssuer.ID(key), exp)
			if err != nil {
				t.Fatal(err)
			}
			s := Secret(tok, nil, "kubeadm token create")
			m[s.Name] = s
			return Token{}
		}},
		{name: "malformed", wantExisting: true, wantErr: ErrMalformed, before: func(t *testing.T, m memSecrets) Token {
			_, s, err := testIssuer.NewSecret(key, exp, "edited")
			if err != nil {
				t.Fatal(err)
			}
			s.Data["token-secret"] = []byte("not a token secret")
			m[s.Name] = s
			return Token{}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := memSecrets{}
			reused := tt.before(t, m)
			before := map[string]string{}
			for name, s := range m {
				before[name] = s.String()
			}
			tok, existing, err := testIssuer.Ensure(t.Context(), m, key, exp, "description")
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Ensure error = %v, want %v", err, tt.wantErr)
			}
			if (existing != nil) != tt.wantExisting {
				t.Fatalf("Ensure existing = %v, want existing %v", existing, tt.wantExisting)
			}
			if tt.wantErr != nil || tt.wantExisting {
				// Nothing created or changed.
				if len(m) != len(before) {
					t.Fatalf("Ensure left %d Secrets, want the %d there were", len(m), len(before))
				}
				for name, s := range m {
					if s.String() != before[name] {
						t.Fatalf("Ensure changed Secret %s", name)
					}
				}
			}
			if tt.wantErr != nil {
				if tok != (Token{}) {
					t.Fatal("Ensure returned a token with its error")
				}
				return
			}
			if tt.wantExisting {
				if tok != reused {
					t.Fatalf("Ensure returned %s, want the existing token %s", tok.ID, reused.ID)
				}
				return
			}
			s, ok := m[SecretName(testIssuer.ID(key))]
			if !ok || !testIssuer.Owns(s, key) {
				t.Fatal("Ensure did not create the owner's labelled Secret")
			}
			if got, _ := FromSecret(s); got != tok || !tok.Expiration.Equal(exp) {
				t.Fatalf("created Secret holds %+v, Ensure returned %+v, want expiration %s", got.Expiration, tok.Expiration, exp)
			}
		})
	}
}

func TestIssuerDerivations(t *testing.T) {
	other := Issuer{Label: testIssuer.Label, IDDomain: "other-id", OwnerDomain: "other-owner"}
	// Known answers: the ids and labels of tokens issued before must be
	// found again after an upgrade.
	sum := sha256.Sum256([]byte("test-owner\x00k"))
	if got, want := testIssuer.OwnerLabel("k"), hex.EncodeToString(sum[:24]); got != want {
		t.Fatalf("OwnerLabel = %s, want %s", got, want)
	}
	if got, want := testIssuer.ID("k"), derivedID("test-id", "k"); got != want {
		t.Fatalf("ID = %s, want %s", got, want)
	}
	if testIssuer.ID("k") == other.ID("k") || testIssuer.OwnerLabel("k") == other.OwnerLabel("k") {
		t.Fatal("two issuers' domains derive the same values")
	}
	if testIssuer.OwnerLabel("a") == testIssuer.OwnerLabel("b") {
		t.Fatal("two owners have one label")
	}
	if l := testIssuer.OwnerLabel("k"); len(l) > 63 {
		t.Fatalf("owner label %q is longer than a label value may be", l)
	}
}
