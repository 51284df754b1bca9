package joinservice

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
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
)

// Bootstrap token settings (kubeadm reference, "kubeadm token"; Kubernetes
// docs, "Authenticating with Bootstrap Tokens").
const (
	// TokenTTL is the lifetime of an issued bootstrap token.
	TokenTTL = 15 * time.Minute
	// TokenGroup is the extra group of issued tokens, the one kubeadm's
	// RBAC lets join nodes.
	TokenGroup = bootstraptoken.Group
	// tokenReuseMargin: a token of the same join request is handed out again
	// while it has at least this long left; otherwise it is renewed.
	tokenReuseMargin = 10 * time.Minute
	// LabelJoinRequest labels token Secrets with their join request's key.
	LabelJoinRequest = "gatehouse.dev/join-request"
)

// errTokenIDTaken: the deterministic token id of a request is used by a
// token that is not the request's (a kubeadm-made token; about 1 in 2^31).
var errTokenIDTaken = errors.New("bootstrap token id is taken by a token of another request")

// Tokens issues kubeadm bootstrap tokens as Secrets in kube-system.
//
// Issuing is idempotent per join request: the token id is derived from the
// request key (the node's attestation identity and node name), so a retry
// after a lost response or an API server restart finds the token it created
// before instead of leaving an orphan, and each node has at most one token.
type Tokens struct {
	client kubernetes.Interface
	now    func() time.Time
}

// NewTokens returns a token issuer; now is the clock expirations are set by.
func NewTokens(client kubernetes.Interface, now func() time.Time) *Tokens {
	return &Tokens{client: client, now: now}
}

// Token is an issued bootstrap token.
type Token = bootstraptoken.Token

// requestLabel returns the label value for a request key: hex of its
// SHA-256, shortened to fit a label value.
func requestLabel(requestKey string) string {
	sum := sha256.Sum256([]byte("gatehouse-join-request\x00" + requestKey))
	return hex.EncodeToString(sum[:24])
}

// tokenID derives the token id of a request key.
func tokenID(requestKey string) string {
	return bootstraptoken.DerivedID("gatehouse-token-id", requestKey)
}

// Issue returns the bootstrap token of the request identified by
// requestKey: the existing one while it has tokenReuseMargin left, else a
// new or renewed one with TokenTTL, authentication and signing usages and
// the group TokenGroup. description is stored in the Secret (not secret).
func (t *Tokens) Issue(ctx context.Context, requestKey, description string) (Token, error) {
	label := requestLabel(requestKey)
	secrets := t.client.CoreV1().Secrets(metav1.NamespaceSystem)
	token, err := bootstraptoken.New(tokenID(requestKey), t.now().Add(TokenTTL))
	if err != nil {
		return Token{}, err
	}
	s := tokenSecret(token, label, description)
	if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err == nil {
		return token, nil
	} else if !apierrors.IsAlreadyExists(err) {
		return Token{}, fmt.Errorf("creating bootstrap token Secret: %w", err)
	}
	existing, err := secrets.Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil {
		return Token{}, fmt.Errorf("reading bootstrap token Secret %s: %w", s.Name, err)
	}
	if existing.Labels[LabelJoinRequest] != label {
		return Token{}, fmt.Errorf("%w: %s", errTokenIDTaken, s.Name)
	}
	if old, ok := bootstraptoken.FromSecret(existing); ok && old.Expiration.Sub(t.now()) >= tokenReuseMargin {
		return old, nil
	}
	s.ResourceVersion = existing.ResourceVersion
	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return Token{}, fmt.Errorf("renewing bootstrap token Secret %s: %w", s.Name, err)
	}
	return token, nil
}

func tokenSecret(token Token, label, description string) *corev1.Secret {
	return bootstraptoken.Secret(token, map[string]string{LabelJoinRequest: label}, description)
}
