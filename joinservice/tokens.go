package joinservice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
)

// Bootstrap token settings (kubeadm reference, "kubeadm token"; Kubernetes
// docs, "Authenticating with Bootstrap Tokens").
const (
	// tokenTTL is the lifetime of an issued bootstrap token.
	tokenTTL = 15 * time.Minute
	// tokenReuseMargin: a token of the same join request is handed out again
	// while it has at least this long left; otherwise it is renewed.
	tokenReuseMargin = 10 * time.Minute
	// labelJoinRequest labels token Secrets with their join request's key.
	labelJoinRequest = "gatehouse.dev/join-request"
)

// requestTokens derives a join request's token id and owner label from its
// request key (the node's attestation identity, NUL, and node name), and
// names the node on the Secret (bootstraptoken.AnnotationNode).
var requestTokens = bootstraptoken.Issuer{
	Label:       labelJoinRequest,
	IDDomain:    "gatehouse-token-id",
	OwnerDomain: "gatehouse-join-request",
	Annotations: requestTokensAnnotations,
}

// requestTokensAnnotations names the node of request key on its Secret.
func requestTokensAnnotations(key string) map[string]string {
	_, node, _ := strings.Cut(key, "\x00")
	return map[string]string{bootstraptoken.AnnotationNode: node}
}

// Tokens issues kubeadm bootstrap tokens as Secrets in kube-system.
//
// Issuing is idempotent per join request (bootstraptoken.Issuer): a retry
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

// Issue returns the bootstrap token of the request identified by
// requestKey (attestation identity, NUL, node name; the Secret names the
// node in bootstraptoken.AnnotationNode): the existing one while it has tokenReuseMargin left, else a
// new or renewed one with tokenTTL, authentication and signing usages and
// the group tokenGroup. description is stored in the Secret (not secret).
// A token id held by another owner's token is bootstraptoken.ErrIDTaken.
//
// address is where the node connected from, recorded on the Secret
// (bootstraptoken.AnnotationAddress) for the approval of its first
// kubelet client certificate; "" records none.
func (t *Tokens) Issue(ctx context.Context, requestKey, address, description string) (bootstraptoken.Token, error) {
	secrets := kubeSystemSecrets{t.client.CoreV1().Secrets(metav1.NamespaceSystem)}
	requestTokens := requestTokens
	if address != "" {
		requestTokens.Annotations = func(key string) map[string]string {
			a := requestTokensAnnotations(key)
			a[bootstraptoken.AnnotationAddress] = address
			return a
		}
	}
	now := t.now()
	token, existing, err := requestTokens.Ensure(ctx, secrets, requestKey, now.Add(tokenTTL), description)
	switch {
	case existing == nil && err == nil:
		return token, nil
	case err == nil && token.Expiration.Sub(now) >= tokenReuseMargin:
		return token, nil
	case err != nil && !errors.Is(err, bootstraptoken.ErrMalformed):
		return bootstraptoken.Token{}, err
	}
	// Too little time left, or malformed: renew in place (same id).
	token, renewed, err := requestTokens.NewSecret(requestKey, now.Add(tokenTTL), description)
	if err != nil {
		return bootstraptoken.Token{}, err
	}
	renewed.ResourceVersion = existing.ResourceVersion
	if _, err := secrets.Update(ctx, renewed, metav1.UpdateOptions{}); err != nil {
		return bootstraptoken.Token{}, fmt.Errorf("renewing bootstrap token Secret %s: %w", renewed.Name, err)
	}
	return token, nil
}

// kubeSystemSecrets adapts client-go's Secrets client to
// bootstraptoken.Secrets.
type kubeSystemSecrets struct {
	corev1client.SecretInterface
}

func (s kubeSystemSecrets) Create(ctx context.Context, secret *corev1.Secret) error {
	_, err := s.SecretInterface.Create(ctx, secret, metav1.CreateOptions{})
	return err
}

func (s kubeSystemSecrets) Get(ctx context.Context, name string) (*corev1.Secret, error) {
	return s.SecretInterface.Get(ctx, name, metav1.GetOptions{})
}
