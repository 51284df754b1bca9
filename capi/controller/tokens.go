package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
)

// Bootstrap tokens for Machines and MachinePools joining with `kubeadm
// join` (internal/bootstraptoken).
const (
	// DefaultTokenTTL is a bootstrap token's lifetime; the controller keeps
	// extending it until the Machine's node has joined, and keeps a
	// MachinePool's token valid for as long as the pool exists.
	DefaultTokenTTL = 15 * time.Minute
	// labelTokenOwner marks token Secrets with their KubeadmConfig (a hash
	// of its UID), so a retried create finds its own token and a deleted
	// config's tokens are found to delete.
	labelTokenOwner = "bootstrap.gatehouse.dev/kubeadm-config" //nolint:gosec // a label name, not a credential
	// annotationTokenRotation counts a MachinePool config's token
	// rotations: its data carries token number n (tokenKey); absent, 0.
	annotationTokenRotation = "bootstrap.gatehouse.dev/bootstrap-token-rotation" //nolint:gosec // an annotation name, not a credential
)

// errTokenGone: the token Secret no longer exists (it expired and the
// token cleaner removed it, or someone deleted it).
var errTokenGone = errors.New("bootstrap token is gone")

// tokens manages the bootstrap tokens of KubeadmConfigs in a workload
// cluster. A config's token id is derived from its UID (and, for a
// MachinePool's rotated tokens, the rotation's number), so creating is
// idempotent: a retry after a lost response finds the token it created
// instead of leaving an orphan, and the data carries one token at a time.
type tokens struct {
	client client.Client
	now    func() time.Time
	ttl    time.Duration
}

// configTokens derives a KubeadmConfig's token ids (from tokenKey) and
// owner label (from its UID).
var configTokens = bootstraptoken.Issuer{
	Label:       labelTokenOwner,
	IDDomain:    "gatehouse-capi-token-id",
	OwnerDomain: "gatehouse-capi-token-owner",
}

// tokenKey is what a config's token id derives from: its UID for its first
// token, the UID and n for a MachinePool's n-th rotated one.
func tokenKey(uid types.UID, rotation int) string {
	if rotation == 0 {
		return string(uid)
	}
	return string(uid) + "/" + strconv.Itoa(rotation)
}

// tokenName is the name of a config's token Secret in kube-system.
func tokenName(uid types.UID, rotation int) string {
	return configTokens.SecretName(tokenKey(uid, rotation))
}

// tokenRotation is the number of the token a config's data carries.
func tokenRotation(config *bootstrapv1.KubeadmConfig) int {
	n, err := strconv.Atoi(config.Annotations[annotationTokenRotation])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// newToken makes token number rotation of config, expiring at expiration,
// and its Secret, labelled with the config's owner label whatever the
// number. For rotation 0 it is configTokens.NewSecret's.
func newToken(config *bootstrapv1.KubeadmConfig, rotation int, expiration time.Time) (*pendingToken, error) {
	tok, err := bootstraptoken.New(configTokens.ID(tokenKey(config.UID, rotation)), expiration)
	if err != nil {
		return nil, err
	}
	sec := bootstraptoken.Secret(tok, map[string]string{labelTokenOwner: configTokens.OwnerLabel(string(config.UID))},
		"bootstrap token of KubeadmConfig "+config.Namespace+"/"+config.Name)
	return &pendingToken{token: tok.String(), secret: sec}, nil
}

// pendingToken is a config's bootstrap token, made for its data but not
// yet created in the workload cluster.
type pendingToken struct {
	// token is "<id>.<secret>".
	token  string
	secret *corev1.Secret
}

// create creates the config's token Secret and returns the token. When the
// config's token exists already (an earlier reconcile created it and its
// result was lost), it returns that one with created false, so that a
// config never has two tokens.
func (t *tokens) create(ctx context.Context, uid types.UID, p *pendingToken) (token string, created bool, err error) {
	err = t.client.Create(ctx, p.secret)
	if err == nil {
		return p.token, true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return "", false, fmt.Errorf("creating bootstrap token Secret %s: %w", p.secret.Name, err)
	}
	s, err := t.owned(ctx, uid, p.secret.Name)
	if err != nil {
		return "", false, fmt.Errorf("bootstrap token Secret %s: %w", p.secret.Name, err)
	}
	old, ok := bootstraptoken.FromSecret(s)
	if !ok {
		return "", false, fmt.Errorf("bootstrap token Secret %s is malformed", s.Name)
	}
	return old.String(), false, nil
}

// owned reads the config's token Secret of that name; errTokenGone when it
// does not exist or is not the config's.
func (t *tokens) owned(ctx context.Context, uid types.UID, name string) (*corev1.Secret, error) {
	s, err := workloadSecrets{t.client}.Get(ctx, name)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, errTokenGone
		}
		return nil, fmt.Errorf("reading bootstrap token Secret: %w", err)
	}
	if !configTokens.Owns(s, string(uid)) {
		return nil, fmt.Errorf("%w: its id is taken by a token of something else", errTokenGone)
	}
	return s, nil
}

// refresh extends the config's token number rotation to now+TTL once less
// than half the TTL is left, and returns when it next needs looking at. A
// token whose Secret still exists is extended even when its expiration has
// passed (nothing reconciled it for longer than the TTL), as CABPK's
// refreshBootstrapTokenIfNeeded does; errTokenGone means the Secret no
// longer exists (the token cleaner removed it once it expired, or someone
// deleted it) or is not the config's.
func (t *tokens) refresh(ctx context.Context, uid types.UID, rotation int) (time.Duration, error) {
	s, err := t.owned(ctx, uid, tokenName(uid, rotation))
	if err != nil {
		return 0, err
	}
	tok, ok := bootstraptoken.FromSecret(s)
	if !ok {
		return 0, fmt.Errorf("bootstrap token Secret %s is malformed", s.Name)
	}
	return t.extend(ctx, s, tok)
}

// extend extends a token expiring in less than half the TTL, or expired
// already, to now+TTL, and returns when it next needs looking at. The
// Secret s must exist: a token whose Secret is gone cannot be extended.
func (t *tokens) extend(ctx context.Context, s *corev1.Secret, tok bootstraptoken.Token) (time.Duration, error) {
	now := t.now()
	if left := tok.Expiration.Sub(now); left > t.ttl/2 {
		return left - t.ttl/2, nil
	}
	patch := client.MergeFrom(s.DeepCopy())
	bootstraptoken.SetExpiration(s, now.Add(t.ttl))
	if err := t.client.Patch(ctx, s, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, errTokenGone // deleted in between
		}
		return 0, fmt.Errorf("extending bootstrap token Secret %s: %w", s.Name, err)
	}
	return t.ttl / 2, nil
}

// list returns the config's token Secrets: its current one and, for a
// MachinePool, the ones rotation replaced that are not deleted yet.
func (t *tokens) list(ctx context.Context, uid types.UID) ([]corev1.Secret, error) {
	var list corev1.SecretList
	if err := t.client.List(ctx, &list, client.InNamespace(metav1.NamespaceSystem),
		client.MatchingLabels{labelTokenOwner: configTokens.OwnerLabel(string(uid))}); err != nil {
		return nil, fmt.Errorf("listing bootstrap token Secrets: %w", err)
	}
	return list.Items, nil
}

// remove deletes every token of the config; none is fine.
func (t *tokens) remove(ctx context.Context, uid types.UID) error {
	list, err := t.list(ctx, uid)
	if err != nil {
		return err
	}
	for i := range list {
		if err := t.delete(ctx, &list[i]); err != nil {
			return err
		}
	}
	return nil
}

func (t *tokens) delete(ctx context.Context, s *corev1.Secret) error {
	if err := t.client.Delete(ctx, s, client.Preconditions{UID: &s.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting bootstrap token Secret %s: %w", s.Name, err)
	}
	return nil
}

// workloadSecrets adapts a workload cluster client to
// bootstraptoken.Secrets (kube-system).
type workloadSecrets struct{ client client.Client }

func (w workloadSecrets) Create(ctx context.Context, s *corev1.Secret) error {
	return w.client.Create(ctx, s)
}

func (w workloadSecrets) Get(ctx context.Context, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	if err := w.client.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: name}, s); err != nil {
		return nil, err
	}
	return s, nil
}

// issueToken creates the join's bootstrap token in the workload cluster,
// after the finalizer that deletes it is on the config, and returns the
// data carrying it: rendered again with the config's existing token when
// an earlier reconcile created one.
func (r *Reconciler) issueToken(ctx context.Context, s *scope, in *render.Input, data []byte) ([]byte, error) {
	wc, err := r.workload.ClientFor(ctx, s.clusterKey())
	if err != nil {
		return nil, err
	}
	if err := r.ensureFinalizer(ctx, s, true); err != nil {
		return nil, err
	}
	t := &tokens{client: wc, now: r.clock.Now, ttl: r.tokenTTL}
	token, created, err := t.create(ctx, s.config.UID, s.token)
	if err != nil {
		return nil, fmt.Errorf("creating the %s's bootstrap token: %w", s.owner.kind(), err)
	}
	if created {
		r.tokenChecks.Store(s.config.UID, r.clock.Now().Add(r.tokenTTL/2))
		return data, nil
	}
	// A token found again (a retry) may be older: check it next pass.
	r.tokenChecks.Delete(s.config.UID)
	if token == s.token.token {
		return data, nil
	}
	v, err := version(s, in)
	if err != nil {
		return nil, err
	}
	in.Spec.JoinConfiguration.Discovery.BootstrapToken.Token = token
	if err := joinConfiguration(in, v); err != nil {
		return nil, err
	}
	return render.Render(*in)
}
