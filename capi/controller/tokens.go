package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
)

// Bootstrap tokens for Machines joining with `kubeadm join`
// (internal/bootstraptoken).
const (
	// DefaultTokenTTL is a bootstrap token's lifetime; the controller keeps
	// extending it until the Machine's node has joined.
	DefaultTokenTTL = 15 * time.Minute
	// labelTokenOwner marks token Secrets with their KubeadmConfig (a hash
	// of its UID), so a retried create finds its own token.
	labelTokenOwner = "bootstrap.gatehouse.dev/kubeadm-config" //nolint:gosec // a label name, not a credential
)

// errTokenGone: the token Secret no longer exists (it expired and the
// token cleaner removed it, or someone deleted it).
var errTokenGone = errors.New("bootstrap token is gone")

// tokens manages the bootstrap tokens of KubeadmConfigs in a workload
// cluster. A config's token id is derived from its UID, so creating is
// idempotent: a retry after a lost response finds the token it created
// instead of leaving an orphan, and each config has at most one token.
type tokens struct {
	client client.Client
	now    func() time.Time
	ttl    time.Duration
}

func ownerLabel(uid types.UID) string {
	sum := sha256.Sum256([]byte("gatehouse-capi-token-owner\x00" + string(uid)))
	return hex.EncodeToString(sum[:24])
}

// tokenID is the public token id of a config UID.
func tokenID(uid types.UID) string {
	return bootstraptoken.DerivedID("gatehouse-capi-token-id", string(uid))
}

// tokenKey is the Secret of a config UID's token.
func tokenKey(uid types.UID) client.ObjectKey {
	return client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: bootstraptoken.SecretName(tokenID(uid))}
}

// ensure returns the config's token "<id>.<secret>", creating it with the
// TTL when it does not exist (created is then true). A token id held by a
// token that is not the config's is an error.
func (t *tokens) ensure(ctx context.Context, uid types.UID, description string) (token string, created bool, err error) {
	tok, err := bootstraptoken.New(tokenID(uid), t.now().Add(t.ttl))
	if err != nil {
		return "", false, err
	}
	s := bootstraptoken.Secret(tok, map[string]string{labelTokenOwner: ownerLabel(uid)}, description)
	err = t.client.Create(ctx, s)
	if err == nil {
		return tok.String(), true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return "", false, fmt.Errorf("creating bootstrap token Secret %s: %w", s.Name, err)
	}
	existing, err := t.owned(ctx, uid)
	if err != nil {
		return "", false, err
	}
	old, ok := bootstraptoken.FromSecret(existing)
	if !ok {
		return "", false, fmt.Errorf("bootstrap token Secret %s is malformed", s.Name)
	}
	return old.String(), false, nil
}

// owned reads the config's token Secret; errTokenGone when it does not
// exist or is not the config's.
func (t *tokens) owned(ctx context.Context, uid types.UID) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	key := tokenKey(uid)
	if err := t.client.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, errTokenGone
		}
		return nil, fmt.Errorf("reading bootstrap token Secret %s: %w", key.Name, err)
	}
	if s.Labels[labelTokenOwner] != ownerLabel(uid) {
		return nil, fmt.Errorf("%w: its id is taken by a token of something else", errTokenGone)
	}
	return s, nil
}

// refresh extends the config's token to now+TTL once less than half the
// TTL is left, and returns when it next needs looking at. It returns
// errTokenGone when the token Secret no longer exists.
func (t *tokens) refresh(ctx context.Context, uid types.UID) (time.Duration, error) {
	s, err := t.owned(ctx, uid)
	if err != nil {
		return 0, err
	}
	now := t.now()
	tok, ok := bootstraptoken.FromSecret(s)
	if !ok {
		return 0, fmt.Errorf("bootstrap token Secret %s is malformed", s.Name)
	}
	if !tok.Expiration.After(now) {
		return 0, errTokenGone
	}
	if left := tok.Expiration.Sub(now); left >= t.ttl/2 {
		return left - t.ttl/2, nil
	}
	patch := client.MergeFrom(s.DeepCopy())
	bootstraptoken.SetExpiration(s, now.Add(t.ttl))
	if err := t.client.Patch(ctx, s, patch); err != nil {
		return 0, fmt.Errorf("extending bootstrap token Secret %s: %w", s.Name, err)
	}
	return t.ttl / 2, nil
}

// remove deletes the config's token; a missing one is fine.
func (t *tokens) remove(ctx context.Context, uid types.UID) error {
	s, err := t.owned(ctx, uid)
	if errors.Is(err, errTokenGone) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := t.client.Delete(ctx, s, client.Preconditions{UID: &s.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting bootstrap token Secret %s: %w", s.Name, err)
	}
	return nil
}
