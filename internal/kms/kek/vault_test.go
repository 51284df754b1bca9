package kek_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek/kektest"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// wrappedOnVault starts a Vault with a Transit key and a token allowed to
// use it, and wraps a new master secret with it.
func wrappedOnVault(t *testing.T) (v *kektest.Vault, token, tokenFile string, secret, salt []byte, uri string) {
	t.Helper()
	v = kektest.NewVault(t)
	v.CreateKey("gatehouse")
	token, tokenFile = v.TokenFile("gatehouse")
	secret, salt = newSecret(t)
	uri, err := kek.WrapNew(t.Context(), v.URI("gatehouse", tokenFile).String(), secret, salt)
	if err != nil {
		t.Fatal(err)
	}
	return v, token, tokenFile, secret, salt, uri
}

// TestVaultTransit wraps the master secret with a real Vault's Transit
// engine and goes through each way Vault refuses: another salt, the token
// revoked (and a new token in the file), Vault sealed (and unsealed), a
// rotation with rewrap, and the old version retired.
func TestVaultTransit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v, token, tokenFile, secret, salt, uri := wrappedOnVault(t)
	if !strings.Contains(uri, "wrapped=") {
		t.Fatalf("wrapped URI %q", uri)
	}
	testkit.AssertNoSecrets(t, uri, [][]byte{secret})
	unwraps := func(t *testing.T, uri string) {
		t.Helper()
		got, gotSalt, err := kek.UnwrapURI(ctx, uri)
		if err != nil || !bytes.Equal(got, secret) || !bytes.Equal(gotSalt, salt) {
			t.Fatalf("unwrap: %v, or another secret", err)
		}
	}
	refuses := func(t *testing.T, uri, want string) {
		t.Helper()
		_, _, err := kek.UnwrapURI(ctx, uri)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("unwrap error = %v, want one containing %q", err, want)
		}
		testkit.AssertNoSecrets(t, err.Error(), [][]byte{secret, []byte(token)})
	}
	unwraps(t, uri)
	parsed, _ := kms.ParseURI(uri)
	otherSalt := *parsed.(*kms.VaultTransitURI)
	otherSalt.Salt = bytes.Repeat([]byte{7}, 32)

	t.Run("another salt", func(t *testing.T) { refuses(t, otherSalt.String(), "message authentication failed") })
	t.Run("token revoked, then replaced", func(t *testing.T) {
		v.RevokeToken(token)
		refuses(t, uri, "permission denied")
		newToken, newFile := v.TokenFile("gatehouse")
		data, _ := os.ReadFile(newFile)
		if err := os.WriteFile(tokenFile, data, 0o600); err != nil {
			t.Fatal(err)
		}
		token = newToken
		unwraps(t, uri)
	})
	t.Run("sealed", func(t *testing.T) {
		v.Seal()
		refuses(t, uri, "Vault is sealed")
		v.Unseal()
		unwraps(t, uri)
	})
	t.Run("rotated, rewrapped, old version retired", func(t *testing.T) {
		v.RotateKey("gatehouse")
		rewrapped, err := kek.Rewrap(ctx, uri, "")
		if err != nil {
			t.Fatal(err)
		}
		p, _ := kms.ParseURI(rewrapped)
		if w := p.(*kms.VaultTransitURI).Wrapped; !bytes.HasPrefix(w, []byte("vault:v2:")) {
			t.Fatalf("rewrapped ciphertext %q is not of version 2", w)
		}
		v.SetMinDecryptionVersion("gatehouse", 2)
		refuses(t, uri, "ciphertext or signature version is disallowed by policy")
		unwraps(t, rewrapped)
		uri = rewrapped
	})
	t.Run("moved to another KMS", func(t *testing.T) {
		l := kektest.NewLocalKMS(t)
		moved, err := kek.Rewrap(ctx, uri, l.URI(l.CreateKey()).String(), kektest.AWSOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := kek.UnwrapURI(ctx, moved, kektest.AWSOptions()...)
		if err != nil || !bytes.Equal(got, secret) {
			t.Fatalf("moved from Vault to AWS KMS: %v", err)
		}
	})
}

// TestWrappedKMSVaultTokenRevoked: the key service's key source stops
// serving keys when its Vault token is revoked, naming Vault's answer, and
// serves again with a new token.
func TestWrappedKMSVaultTokenRevoked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v, token, tokenFile, _, _, uri := wrappedOnVault(t)
	w := kms.NewWrappedKMS(func(ctx context.Context) ([]byte, []byte, error) { return kek.UnwrapURI(ctx, uri) },
		time.Minute, clocktesting.NewFakeClock(time.Now()), nil)
	if err := w.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.GetDataKey(ctx, keys.MeasurementSecretID, 32); err != nil {
		t.Fatal(err)
	}
	v.RevokeToken(token)
	_ = w.Check(ctx)
	_, err := w.GetDataKey(ctx, keys.MeasurementSecretID, 32)
	var unavailable *kms.UnavailableError
	if !errors.As(err, &unavailable) || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("after the token was revoked: %v, want *UnavailableError naming Vault's permission denied", err)
	}
	_, newFile := v.TokenFile("gatehouse")
	data, _ := os.ReadFile(newFile)
	if err := os.WriteFile(tokenFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := w.Check(ctx); err != nil {
		t.Fatalf("with a new token: %v", err)
	}
}
