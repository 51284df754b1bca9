package kek

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	awskms "github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/kms/types"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

// awsKMS is a KEK in AWS KMS: a symmetric key wrapping with Encrypt,
// unwrapping with Decrypt (naming the key, so a ciphertext of another key
// is refused) and re-wrapping with ReEncrypt, the plaintext never leaving
// the KMS (AWS KMS API Reference, "Encrypt", "Decrypt", "ReEncrypt").
type awsKMS struct {
	client *awskms.Client
	keyID  string
}

// openAWSKMS returns the KEK u names. Credentials come from the AWS SDK's
// default chain; opts add to the SDK's loading options (a test's static
// credentials, say).
func openAWSKMS(ctx context.Context, u *kms.AWSKMSURI, opts ...func(*config.LoadOptions) error) (*awsKMS, error) {
	cfg, err := config.LoadDefaultConfig(ctx, append([]func(*config.LoadOptions) error{config.WithRegion(u.Region)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("loading AWS configuration: %w", err)
	}
	client := awskms.NewFromConfig(cfg, func(o *awskms.Options) {
		if u.Endpoint != "" {
			o.BaseEndpoint = aws.String(u.Endpoint)
		}
	})
	return &awsKMS{client: client, keyID: u.KeyID}, nil
}

// Wrap encrypts plaintext under the KEK, bound to aad (the encryption
// context).
func (k *awsKMS) Wrap(ctx context.Context, plaintext []byte, aad map[string]string) ([]byte, error) {
	out, err := k.client.Encrypt(ctx, &awskms.EncryptInput{
		KeyId: aws.String(k.keyID), Plaintext: plaintext, EncryptionContext: aad,
		EncryptionAlgorithm: types.EncryptionAlgorithmSpecSymmetricDefault,
	})
	if err != nil {
		return nil, fmt.Errorf("AWS KMS key %s: encrypting: %w", k.keyID, err)
	}
	return out.CiphertextBlob, nil
}

// Unwrap decrypts wrapped with the KEK; another key's ciphertext, another
// aad, a disabled key or refused credentials are errors.
func (k *awsKMS) Unwrap(ctx context.Context, wrapped []byte, aad map[string]string) ([]byte, error) {
	out, err := k.client.Decrypt(ctx, &awskms.DecryptInput{
		KeyId: aws.String(k.keyID), CiphertextBlob: wrapped, EncryptionContext: aad,
		EncryptionAlgorithm: types.EncryptionAlgorithmSpecSymmetricDefault,
	})
	if err != nil {
		return nil, fmt.Errorf("AWS KMS key %s: decrypting the wrapped master secret: %w", k.keyID, err)
	}
	return out.Plaintext, nil
}

// Rewrap re-encrypts wrapped, a ciphertext of the KEK from, under this
// KEK's current key material without the plaintext leaving the KMS.
func (k *awsKMS) Rewrap(ctx context.Context, from *awsKMS, wrapped []byte, aad map[string]string) ([]byte, error) {
	out, err := k.client.ReEncrypt(ctx, &awskms.ReEncryptInput{
		CiphertextBlob: wrapped, SourceKeyId: aws.String(from.keyID), SourceEncryptionContext: aad,
		DestinationKeyId: aws.String(k.keyID), DestinationEncryptionContext: aad,
		SourceEncryptionAlgorithm:      types.EncryptionAlgorithmSpecSymmetricDefault,
		DestinationEncryptionAlgorithm: types.EncryptionAlgorithmSpecSymmetricDefault,
	})
	if err != nil {
		return nil, fmt.Errorf("AWS KMS: re-encrypting from key %s to key %s: %w", from.keyID, k.keyID, err)
	}
	return out.CiphertextBlob, nil
}
