package bootstraptoken

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// ErrIDTaken means the token id derived for an owner is held by a Secret that is
// not the owner's (a token made by `kubeadm token create` or another
// issuer; about 1 in 2^31 per pair of tokens).
var ErrIDTaken = errors.New("bootstrap token id is taken by a token of another owner")

// ErrMalformed means an owner's token Secret holds no valid token or expiration
// (edited by hand, or written by something else).
var ErrMalformed = errors.New("bootstrap token Secret is malformed")

// Secrets is the part of the kube-system Secrets API an Issuer uses; the
// caller adapts its client (client-go or controller-runtime) to it. Errors
// are the API server's (apierrors.IsAlreadyExists, IsNotFound).
type Secrets interface {
	Create(ctx context.Context, s *corev1.Secret) error
	Get(ctx context.Context, name string) (*corev1.Secret, error)
}

// Issuer issues bootstrap tokens idempotently per owner: an owner's token
// id is derived from its key, and its Secret carries a label naming the
// owner, so a retry after a lost response, a restart or a race finds the
// token made before instead of leaving an orphan, and each owner has at
// most one token.
type Issuer struct {
	// Label is the name of the label marking a Secret with its owner.
	Label string
	// IDDomain separates this issuer's derived token ids from others'.
	IDDomain string
	// OwnerDomain separates this issuer's owner label values from others'.
	OwnerDomain string
	// Annotations, when set, returns the annotations of the owner's
	// Secret (e.g. AnnotationNode).
	Annotations func(key string) map[string]string
}

// AnnotationNode is the annotation of a token Secret that names the one
// node the token was issued to: the join service's tokens carry it, and the kubelet CSR
// approver grants such a token a client certificate for that node only.
const AnnotationNode = "gatehouse.dev/node"

// AnnotationAddress is the annotation of a token Secret that names the
// address the node it was issued to connected from: the kubelet CSR
// approver fetches that node's fresh evidence there before it approves the
// node's first client certificate (its Node, with its addresses, does not
// exist yet).
const AnnotationAddress = "gatehouse.dev/address"

// ID is the token id of the owner with key.
func (i Issuer) ID(key string) string { return derivedID(i.IDDomain, key) }

// SecretName is the name of the owner's token Secret in kube-system.
func (i Issuer) SecretName(key string) string { return SecretName(i.ID(key)) }

// OwnerLabel is the owner label value of key: hex of the first 24 bytes of
// SHA-256(OwnerDomain NUL key), short enough for a label value and not
// revealing the key.
func (i Issuer) OwnerLabel(key string) string {
	sum := sha256.Sum256([]byte(i.OwnerDomain + "\x00" + key))
	return hex.EncodeToString(sum[:24])
}

// Owns reports whether s is the token Secret of the owner with key.
func (i Issuer) Owns(s *corev1.Secret, key string) bool {
	return s.Labels[i.Label] == i.OwnerLabel(key)
}

// NewSecret returns a fresh token of the owner with key, expiring at
// expiration, and its Secret (labelled with the owner; description is not
// secret).
func (i Issuer) NewSecret(key string, expiration time.Time, description string) (Token, *corev1.Secret, error) {
	t, err := New(i.ID(key), expiration)
	if err != nil {
		return Token{}, nil, err
	}
	s := Secret(t, map[string]string{i.Label: i.OwnerLabel(key)}, description)
	if i.Annotations != nil {
		s.Annotations = i.Annotations(key)
	}
	return t, s, nil
}

// Ensure makes sure the owner with key has a token. It creates one expiring
// at expiration and returns it with existing nil; when the owner's Secret
// exists already it returns that Secret's token and the Secret (for the
// caller to reuse, renew or refresh) and creates nothing. A Secret holding
// the id that is not the owner's is ErrIDTaken; an owned Secret that holds
// no valid token is ErrMalformed, returned with the Secret so the caller
// may replace it. Other errors wrap the API server's.
func (i Issuer) Ensure(ctx context.Context, secrets Secrets, key string, expiration time.Time, description string) (token Token, existing *corev1.Secret, err error) {
	t, s, err := i.NewSecret(key, expiration, description)
	if err != nil {
		return Token{}, nil, err
	}
	err = secrets.Create(ctx, s)
	if err == nil {
		return t, nil, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return Token{}, nil, fmt.Errorf("creating bootstrap token Secret %s: %w", s.Name, err)
	}
	existing, err = secrets.Get(ctx, s.Name)
	if err != nil {
		return Token{}, nil, fmt.Errorf("reading bootstrap token Secret %s: %w", s.Name, err)
	}
	if !i.Owns(existing, key) {
		return Token{}, nil, fmt.Errorf("%w: %s", ErrIDTaken, s.Name)
	}
	old, ok := FromSecret(existing)
	if !ok {
		return Token{}, existing, fmt.Errorf("%w: %s", ErrMalformed, s.Name)
	}
	return old, existing, nil
}
