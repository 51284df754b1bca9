// Package secretstore keeps wrapped data keys of the PKCS#11 KMS in
// Kubernetes Secrets (kms.DEKStore).
package secretstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// wrappedKey is the data key of the Secret holding a wrapped DEK.
const wrappedKey = "wrapped-dek"

// Store keeps each wrapped DEK in a Kubernetes Secret of its own,
// named gatehouse-dek-<first 40 hex digits of SHA-256(id)>; creation is
// atomic because the API server refuses a second Secret of the same name.
type Store struct {
	client    kubernetes.Interface
	namespace string
}

// New returns a store in namespace.
func New(client kubernetes.Interface, namespace string) *Store {
	return &Store{client: client, namespace: namespace}
}

// secretName returns the name of the Secret holding id's wrapped DEK.
func secretName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "gatehouse-dek-" + hex.EncodeToString(sum[:])[:40]
}

// Get returns the wrapped DEK for id.
func (s *Store) Get(ctx context.Context, id string) ([]byte, bool, error) {
	secret, err := s.client.CoreV1().Secrets(s.namespace).Get(ctx, secretName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if got := secret.Annotations["gatehouse.dev/data-key-id"]; got != id {
		return nil, false, fmt.Errorf("secret %s holds the key of id %q, not %q", secret.Name, got, id)
	}
	return secret.Data[wrappedKey], true, nil
}

// Create stores id's wrapped DEK unless a Secret for id exists already.
func (s *Store) Create(ctx context.Context, id string, wrapped []byte) (bool, error) {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:        secretName(id),
			Namespace:   s.namespace,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "gatehouse-keyservice"},
			Annotations: map[string]string{"gatehouse.dev/data-key-id": id},
		},
		Type: "gatehouse.dev/wrapped-dek",
		Data: map[string][]byte{wrappedKey: wrapped},
	}
	_, err := s.client.CoreV1().Secrets(s.namespace).Create(ctx, secret, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}
