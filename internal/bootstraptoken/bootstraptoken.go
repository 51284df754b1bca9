// Package bootstraptoken makes kubeadm bootstrap tokens and their Secrets
// (kubeadm reference, "kubeadm token"; Kubernetes docs, "Authenticating
// with Bootstrap Tokens"): a token id derived from a caller's key, so a
// retried issue finds the token it made before instead of leaving an
// orphan, a random secret part, and the kube-system Secret the API server
// and kubeadm read. It talks to no API server; callers create the Secrets.
package bootstraptoken

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
)

// Group is the extra group of the tokens, the one kubeadm's RBAC lets join
// nodes.
const Group = "system:bootstrappers:kubeadm:default-node-token"

// idAlphabet is the bootstrap token charset, [a-z0-9].
const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// Token is a bootstrap token.
type Token struct {
	// ID is the public part, [a-z0-9]{6}.
	ID string
	// Secret is the secret part, [a-z0-9]{16}.
	Secret string
	// Expiration is when the API server stops accepting it (whole seconds).
	Expiration time.Time
}

// String returns "<id>.<secret>", the form kubeadm takes. Secret.
func (t Token) String() string { return t.ID + "." + t.Secret }

// derivedID returns the token id of key within domain: SHA-256 of
// domain NUL key, mapped onto the token charset. Distinct domains keep two
// issuers' ids apart.
func derivedID(domain, key string) string {
	sum := sha256.Sum256([]byte(domain + "\x00" + key))
	id := make([]byte, 6)
	for i := range id {
		id[i] = idAlphabet[int(sum[i])%len(idAlphabet)]
	}
	return string(id)
}

// New returns a token with id, a fresh random secret part and expiration.
func New(id string, expiration time.Time) (Token, error) {
	generated, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return Token{}, fmt.Errorf("generating bootstrap token: %w", err)
	}
	parts := bootstraputil.BootstrapTokenRegexp.FindStringSubmatch(generated)
	if len(parts) != 3 {
		return Token{}, errors.New("generating bootstrap token: unexpected format")
	}
	return Token{ID: id, Secret: parts[2], Expiration: expiration.UTC().Truncate(time.Second)}, nil
}

// SecretName is the name of a token id's Secret in kube-system.
func SecretName(id string) string { return bootstraputil.BootstrapTokenSecretName(id) }

// Secret is the kube-system Secret of t: authentication and signing
// usages, the group Group, the labels and description given (not secret).
func Secret(t Token, labels map[string]string, description string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SecretName(t.ID), Namespace: metav1.NamespaceSystem, Labels: labels},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		Data: map[string][]byte{
			bootstrapapi.BootstrapTokenDescriptionKey:      []byte(description),
			bootstrapapi.BootstrapTokenIDKey:               []byte(t.ID),
			bootstrapapi.BootstrapTokenSecretKey:           []byte(t.Secret),
			bootstrapapi.BootstrapTokenExpirationKey:       []byte(t.Expiration.UTC().Format(time.RFC3339)),
			bootstrapapi.BootstrapTokenUsageAuthentication: []byte("true"),
			bootstrapapi.BootstrapTokenUsageSigningKey:     []byte("true"),
			bootstrapapi.BootstrapTokenExtraGroupsKey:      []byte(Group),
		},
	}
}

// FromSecret reads the token of a bootstrap token Secret; false when the
// Secret does not hold a valid token and expiration.
func FromSecret(s *corev1.Secret) (Token, bool) {
	id, secret := string(s.Data[bootstrapapi.BootstrapTokenIDKey]), string(s.Data[bootstrapapi.BootstrapTokenSecretKey])
	exp, err := time.Parse(time.RFC3339, string(s.Data[bootstrapapi.BootstrapTokenExpirationKey]))
	if err != nil || !bootstraputil.IsValidBootstrapToken(id+"."+secret) {
		return Token{}, false
	}
	return Token{ID: id, Secret: secret, Expiration: exp}, true
}

// SetExpiration changes the expiration in a token Secret (its secret part
// stays).
func SetExpiration(s *corev1.Secret, expiration time.Time) {
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[bootstrapapi.BootstrapTokenExpirationKey] = []byte(expiration.UTC().Truncate(time.Second).Format(time.RFC3339))
}
