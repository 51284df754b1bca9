package kek_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
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

func newSecret(t *testing.T) (secret, salt []byte) {
	t.Helper()
	secret, salt = make([]byte, 32), make([]byte, 32)
	_, _ = rand.Read(secret)
	_, _ = rand.Read(salt)
	return secret, salt
}

// wrappedOnLocalKMS starts a local-kms with two keys and wraps a new master
// secret with the first.
func wrappedOnLocalKMS(t *testing.T) (l *kektest.LocalKMS, keyA, keyB string, secret, salt []byte, uri string) {
	t.Helper()
	l = kektest.NewLocalKMS(t)
	keyA, keyB = l.CreateKey(), l.CreateKey()
	secret, salt = newSecret(t)
	uri, err := kek.WrapNew(t.Context(), l.URI(keyA).String(), secret, salt, kektest.AWSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	return l, keyA, keyB, secret, salt, uri
}

// TestAWSKMSWrap wraps and unwraps a master secret with a real AWS KMS API
// server (local-kms), and shows what does not unwrap.
func TestAWSKMSWrap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, keyA, keyB, secret, salt, uri := wrappedOnLocalKMS(t)
	testkit.AssertNoSecrets(t, uri, [][]byte{secret})
	gotSecret, gotSalt, err := kek.UnwrapURI(ctx, uri, kektest.AWSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotSecret, secret) || !bytes.Equal(gotSalt, salt) {
		t.Fatal("unwrapped secret or salt differs")
	}
	parsed, err := kms.ParseURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	wrapped := parsed.(*kms.AWSKMSURI)

	otherSalt := *wrapped
	otherSalt.Salt = bytes.Repeat([]byte{7}, 32)
	otherKey := *wrapped
	otherKey.KeyID = keyB
	tests := []struct {
		name, uri, wantErr string
		before, after      func()
	}{
		{name: "paired with another salt", uri: otherSalt.String(), wantErr: "InvalidCiphertextException"},
		{name: "named with another key", uri: otherKey.String(), wantErr: "decrypting the wrapped master secret"},
		{
			name: "key disabled", uri: uri, wantErr: "DisabledException",
			before: func() { l.SetKeyEnabled(keyA, false) }, after: func() { l.SetKeyEnabled(keyA, true) },
		},
		{name: "KMS down", uri: uri, wantErr: "connection refused", before: l.Stop, after: l.Start},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
				defer tt.after()
			}
			ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, _, err := kek.UnwrapURI(ctx, tt.uri, kektest.AWSOptions()...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
			testkit.AssertNoSecrets(t, err.Error(), [][]byte{secret})
		})
	}
	// After every refusal the original still unwraps.
	if _, _, err := kek.UnwrapURI(ctx, uri, kektest.AWSOptions()...); err != nil {
		t.Fatal(err)
	}
}

// TestAWSKMSRewrap moves the wrapped master secret to another key with
// ReEncrypt; the old key disabled, the new URI still unwraps the same
// secret.
func TestAWSKMSRewrap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, keyA, keyB, secret, _, uri := wrappedOnLocalKMS(t)
	same, err := kek.Rewrap(ctx, uri, "", kektest.AWSOptions()...)
	if err != nil {
		t.Fatalf("re-wrapping under the same key: %v", err)
	}
	moved, err := kek.Rewrap(ctx, same, l.URI(keyB).String(), kektest.AWSOptions()...)
	if err != nil {
		t.Fatalf("re-wrapping under another key: %v", err)
	}
	if !strings.Contains(moved, "key-id="+keyB) {
		t.Fatalf("re-wrapped URI %q does not name the new key", moved)
	}
	l.SetKeyEnabled(keyA, false)
	got, _, err := kek.UnwrapURI(ctx, moved, kektest.AWSOptions()...)
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("the re-wrapped secret does not unwrap to the same secret with the old key disabled: %v", err)
	}
	if _, err := kek.Rewrap(ctx, uri, l.URI(keyB).String(), kektest.AWSOptions()...); err == nil || !strings.Contains(err.Error(), "DisabledException") {
		t.Fatalf("re-wrapping from a disabled key: error = %v, want DisabledException", err)
	}
	if _, err := kek.Rewrap(ctx, moved, moved, kektest.AWSOptions()...); err == nil || !strings.Contains(err.Error(), "without wrapped and salt") {
		t.Fatalf("re-wrapping to a URI that carries a secret: error = %v", err)
	}
}

// TestWrappedKMS serves keys from a master secret wrapped by a real AWS KMS
// API server: the same keys as ClusterKMS while the KMS answers,
// *UnavailableError with the reason while it is down or the key is
// disabled, no gap when the URI is re-wrapped, and a refusal of a URI that
// unwraps another secret.
func TestWrappedKMS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, keyA, keyB, secret, salt, current := wrappedOnLocalKMS(t)
	var err error
	w := kms.NewWrappedKMS(func(ctx context.Context) ([]byte, []byte, error) {
		return kek.UnwrapURI(ctx, current, kektest.AWSOptions()...)
	}, time.Minute, clocktesting.NewFakeClock(time.Now()), nil)
	want, err := kms.NewClusterKMS(secret, salt)
	if err != nil {
		t.Fatal(err)
	}
	wantKey, _ := want.GetDataKey(ctx, keys.MeasurementSecretID, 32)

	serves := func(t *testing.T) {
		t.Helper()
		if err := w.Check(ctx); err != nil {
			t.Fatalf("check: %v", err)
		}
		got, err := w.GetDataKey(ctx, keys.MeasurementSecretID, 32)
		if err != nil || !bytes.Equal(got, wantKey) {
			t.Fatalf("GetDataKey = %x, %v; want the ClusterKMS key", got, err)
		}
	}
	refuses := func(t *testing.T, reason string) {
		t.Helper()
		checkCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := w.Check(checkCtx); err == nil {
			t.Fatal("check succeeded")
		}
		_, err := w.GetDataKey(ctx, keys.MeasurementSecretID, 32)
		var unavailable *kms.UnavailableError
		if !errors.As(err, &unavailable) || !strings.Contains(err.Error(), reason) {
			t.Fatalf("GetDataKey error = %v, want *UnavailableError naming %q", err, reason)
		}
		testkit.AssertNoSecrets(t, err.Error(), [][]byte{secret})
	}

	if _, err := w.GetDataKey(ctx, keys.MeasurementSecretID, 32); err == nil {
		t.Fatal("keys served before the secret was unwrapped")
	}
	serves(t)

	l.SetKeyEnabled(keyA, false)
	refuses(t, "DisabledException")
	l.SetKeyEnabled(keyA, true)
	serves(t)

	l.Stop()
	refuses(t, "connection refused")
	l.Start()
	serves(t)

	// Re-wrapped under key B, with key A disabled: no check fails.
	if current, err = kek.Rewrap(ctx, current, l.URI(keyB).String(), kektest.AWSOptions()...); err != nil {
		t.Fatal(err)
	}
	l.SetKeyEnabled(keyA, false)
	serves(t)

	// Another cluster's wrapped secret in its place is refused.
	intruder, _ := newSecret(t)
	if current, err = kek.WrapNew(ctx, l.URI(keyB).String(), intruder, salt, kektest.AWSOptions()...); err != nil {
		t.Fatal(err)
	}
	refuses(t, "different master secret")
}
