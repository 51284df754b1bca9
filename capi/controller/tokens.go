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
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Bootstrap tokens for Machines joining with `kubeadm join` (kubeadm
// reference, "kubeadm token"; Kubernetes docs, "Authenticating with
// Bootstrap Tokens").
const (
	// DefaultTokenTTL is a bootstrap token's lifetime; the controller keeps
	// extending it until the Machine's node has joined.
	DefaultTokenTTL = 15 * time.Minute
	// tokenGroup is the group kubeadm's RBAC lets join nodes.
	tokenGroup = "system:bootstrappers:kubeadm:default-node-token"
	// labelTokenOwner marks token Secrets with their KubeadmConfig (a hash
	// of its UID), so a retried create finds its own token.
	labelTokenOwner = "bootstrap.gatehouse.dev/kubeadm-config" //nolint:gosec // a label name, not a credential
	// tokenIDAlphabet is the bootstrap token charset, [a-z0-9].
	tokenIDAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
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

// tokenIDFor derives the public token id of a config UID.
func tokenIDFor(uid types.UID) string {
	sum := sha256.Sum256([]byte("gatehouse-capi-token-id\x00" + string(uid)))
	id := make([]byte, 6)
	for i := range id {
		id[i] = tokenIDAlphabet[int(sum[i])%len(tokenIDAlphabet)]
	}
	return string(id)
}

// ensure returns the config's token "<id>.<secret>", creating it with the
// TTL when it does not exist (created is then true). A token id held by a
// token that is not the config's is an error.
func (t *tokens) ensure(ctx context.Context, uid types.UID, description string) (token string, created bool, err error) {
	id := tokenIDFor(uid)
	generated, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return "", false, fmt.Errorf("generating bootstrap token: %w", err)
	}
	parts := bootstraputil.BootstrapTokenRegexp.FindStringSubmatch(generated)
	if len(parts) != 3 {
		return "", false, errors.New("generating bootstrap token: unexpected format")
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      bootstraputil.BootstrapTokenSecretName(id),
			Namespace: metav1.NamespaceSystem,
			Labels:    map[string]string{labelTokenOwner: ownerLabel(uid)},
		},
		Type: bootstrapapi.SecretTypeBootstrapToken,
		Data: map[string][]byte{
			bootstrapapi.BootstrapTokenDescriptionKey:      []byte(description),
			bootstrapapi.BootstrapTokenIDKey:               []byte(id),
			bootstrapapi.BootstrapTokenSecretKey:           []byte(parts[2]),
			bootstrapapi.BootstrapTokenExpirationKey:       []byte(t.now().Add(t.ttl).UTC().Format(time.RFC3339)),
			bootstrapapi.BootstrapTokenUsageAuthentication: []byte("true"),
			bootstrapapi.BootstrapTokenUsageSigningKey:     []byte("true"),
			bootstrapapi.BootstrapTokenExtraGroupsKey:      []byte(tokenGroup),
		},
	}
	err = t.client.Create(ctx, s)
	if err == nil {
		return id + "." + parts[2], true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return "", false, fmt.Errorf("creating bootstrap token Secret %s: %w", s.Name, err)
	}
	existing := &corev1.Secret{}
	if err := t.client.Get(ctx, client.ObjectKeyFromObject(s), existing); err != nil {
		return "", false, fmt.Errorf("reading bootstrap token Secret %s: %w", s.Name, err)
	}
	if existing.Labels[labelTokenOwner] != ownerLabel(uid) {
		return "", false, fmt.Errorf("bootstrap token id %s is taken by a token of something else", id)
	}
	token = string(existing.Data[bootstrapapi.BootstrapTokenIDKey]) + "." + string(existing.Data[bootstrapapi.BootstrapTokenSecretKey])
	if !bootstraputil.IsValidBootstrapToken(token) {
		return "", false, fmt.Errorf("bootstrap token Secret %s is malformed", s.Name)
	}
	return token, false, nil
}

// refresh extends the config's token to now+TTL once less than half the
// TTL is left, and returns when it next needs looking at. It returns
// errTokenGone when the token Secret no longer exists.
func (t *tokens) refresh(ctx context.Context, uid types.UID) (time.Duration, error) {
	s := &corev1.Secret{}
	key := client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: bootstraputil.BootstrapTokenSecretName(tokenIDFor(uid))}
	if err := t.client.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, errTokenGone
		}
		return 0, fmt.Errorf("reading bootstrap token Secret %s: %w", key.Name, err)
	}
	if s.Labels[labelTokenOwner] != ownerLabel(uid) {
		return 0, errTokenGone
	}
	now := t.now()
	expiration, err := time.Parse(time.RFC3339, string(s.Data[bootstrapapi.BootstrapTokenExpirationKey]))
	if err != nil {
		return 0, fmt.Errorf("bootstrap token Secret %s: expiration: %w", key.Name, err)
	}
	if !expiration.After(now) {
		return 0, errTokenGone
	}
	if left := expiration.Sub(now); left >= t.ttl/2 {
		return left - t.ttl/2, nil
	}
	patch := client.MergeFrom(s.DeepCopy())
	s.Data[bootstrapapi.BootstrapTokenExpirationKey] = []byte(now.Add(t.ttl).UTC().Format(time.RFC3339))
	if err := t.client.Patch(ctx, s, patch); err != nil {
		return 0, fmt.Errorf("extending bootstrap token Secret %s: %w", key.Name, err)
	}
	return t.ttl / 2, nil
}

// remove deletes the config's token; a missing one is fine.
func (t *tokens) remove(ctx context.Context, uid types.UID) error {
	s := &corev1.Secret{}
	key := client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: bootstraputil.BootstrapTokenSecretName(tokenIDFor(uid))}
	if err := t.client.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading bootstrap token Secret %s: %w", key.Name, err)
	}
	if s.Labels[labelTokenOwner] != ownerLabel(uid) {
		return nil
	}
	if err := t.client.Delete(ctx, s, client.Preconditions{UID: &s.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting bootstrap token Secret %s: %w", key.Name, err)
	}
	return nil
}
