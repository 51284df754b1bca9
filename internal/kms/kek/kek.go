// Package kek wraps and unwraps the master secret with a key-encryption
// key (KEK) held by an external KMS: AWS KMS (aws-sdk-go-v2) and Vault's
// Transit engine (Vault's API client), for the kms://aws-kms and
// kms://vault-transit URIs package kms parses (docs/keys.md, "External
// KMS"). It lives apart from package kms so that kms's fuzzed parsers do
// not link the clouds' SDKs.
package kek

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

// keyEncrypter wraps and unwraps with a key-encryption key held by an external KMS;
// aad is the additional authenticated data the ciphertext is bound to
// (WrappedSecret.AAD).
type keyEncrypter interface {
	Wrap(ctx context.Context, plaintext []byte, aad map[string]string) ([]byte, error)
	Unwrap(ctx context.Context, wrapped []byte, aad map[string]string) ([]byte, error)
}

// openKEK opens the KEK of a parsed *kms.AWSKMSURI or *kms.VaultTransitURI;
// awsOpts add to the AWS SDK's loading options.
func openKEK(ctx context.Context, uri any, awsOpts ...func(*config.LoadOptions) error) (keyEncrypter, error) {
	switch u := uri.(type) {
	case *kms.AWSKMSURI:
		return openAWSKMS(ctx, u, awsOpts...)
	case *kms.VaultTransitURI:
		return openVaultTransit(u)
	default:
		return nil, fmt.Errorf("%T is not an external KMS URI: give kms://%s?… or kms://%s?…", uri, kms.BackendAWSKMS, kms.BackendVaultTransit)
	}
}

// UnwrapURI opens the KEK of an external KMS URI (text) carrying a wrapped
// master secret and unwraps it: the master secret and salt.
func UnwrapURI(ctx context.Context, text string, awsOpts ...func(*config.LoadOptions) error) (secret, salt []byte, err error) {
	parsed, err := kms.ParseURI(strings.TrimSpace(text))
	if err != nil {
		return nil, nil, err
	}
	w, ok := kms.External(parsed)
	if !ok || !w.IsWrapped() {
		return nil, nil, fmt.Errorf("the KMS URI carries no wrapped master secret: expect kms://%s?…&wrapped=…&salt=… or kms://%s?…&wrapped=…&salt=…", kms.BackendAWSKMS, kms.BackendVaultTransit)
	}
	kek, err := openKEK(ctx, parsed, awsOpts...)
	if err != nil {
		return nil, nil, err
	}
	secret, err = kek.Unwrap(ctx, w.Wrapped, w.AAD())
	if err != nil {
		return nil, nil, err
	}
	return secret, w.Salt, nil
}

// WrapNew wraps secret under the KEK a KEK URI (text, with no wrapped
// secret yet) names and returns the URI carrying it and salt.
func WrapNew(ctx context.Context, text string, secret, salt []byte, awsOpts ...func(*config.LoadOptions) error) (string, error) {
	parsed, err := kms.ParseURI(strings.TrimSpace(text))
	if err != nil {
		return "", err
	}
	if _, ok := kms.External(parsed); !ok {
		return "", fmt.Errorf("the master secret can be wrapped only by an external KMS: expect kms://%s?… or kms://%s?…", kms.BackendAWSKMS, kms.BackendVaultTransit)
	}
	kek, err := openKEK(ctx, parsed, awsOpts...)
	if err != nil {
		return "", err
	}
	w := kms.WrappedSecret{Salt: salt}
	if w.Wrapped, err = kek.Wrap(ctx, secret, w.AAD()); err != nil {
		return "", err
	}
	return kms.WithWrapped(parsed, w)
}

// Rewrap re-wraps the master secret that from (a URI carrying it) wraps
// under the KEK to names (a KEK URI; to == "" means from's own KEK, at its
// current key version) and returns the URI carrying the new wrapped secret.
// Within one AWS KMS the plaintext never leaves the KMS (ReEncrypt);
// otherwise it is unwrapped and wrapped again in this process's memory
// (Vault Transit's rewrap endpoint ignores associated data, so it cannot
// rewrap what Wrap bound to it). The result is checked to unwrap to the
// same secret before it is returned.
func Rewrap(ctx context.Context, from, to string, awsOpts ...func(*config.LoadOptions) error) (string, error) {
	src, err := kms.ParseURI(strings.TrimSpace(from))
	if err != nil {
		return "", fmt.Errorf("current KMS URI: %w", err)
	}
	w, ok := kms.External(src)
	if !ok || !w.IsWrapped() {
		return "", errors.New("current KMS URI carries no wrapped master secret")
	}
	dst := src
	if to != "" {
		if dst, err = kms.ParseURI(strings.TrimSpace(to)); err != nil {
			return "", fmt.Errorf("new KEK URI: %w", err)
		}
		if dw, ok := kms.External(dst); !ok || dw.IsWrapped() {
			return "", fmt.Errorf("new KEK URI must name a key of kms://%s or kms://%s, without wrapped and salt", kms.BackendAWSKMS, kms.BackendVaultTransit)
		}
	}
	srcKEK, err := openKEK(ctx, src, awsOpts...)
	if err != nil {
		return "", err
	}
	dstKEK, err := openKEK(ctx, dst, awsOpts...)
	if err != nil {
		return "", err
	}
	aad := w.AAD()
	secret, err := srcKEK.Unwrap(ctx, w.Wrapped, aad)
	if err != nil {
		return "", err
	}
	defer clear(secret)
	out := kms.WrappedSecret{Salt: w.Salt}
	srcAWS, srcIsAWS := src.(*kms.AWSKMSURI)
	dstAWS, dstIsAWS := dst.(*kms.AWSKMSURI)
	switch {
	case srcIsAWS && dstIsAWS && srcAWS.Region == dstAWS.Region && srcAWS.Endpoint == dstAWS.Endpoint:
		out.Wrapped, err = dstKEK.(*awsKMS).Rewrap(ctx, srcKEK.(*awsKMS), w.Wrapped, aad)
	default:
		out.Wrapped, err = dstKEK.Wrap(ctx, secret, aad)
	}
	if err != nil {
		return "", err
	}
	again, err := dstKEK.Unwrap(ctx, out.Wrapped, aad)
	if err != nil {
		return "", fmt.Errorf("checking the re-wrapped master secret: %w", err)
	}
	defer clear(again)
	if subtle.ConstantTimeCompare(again, secret) != 1 {
		return "", errors.New("the re-wrapped master secret does not unwrap to the same secret; the old one is kept")
	}
	return kms.WithWrapped(dst, out)
}
