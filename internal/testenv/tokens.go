package testenv

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
)

// CreateBootstrapToken creates a bootstrap token Secret the way kubeadm
// does for `kubeadm token create` (default node token group, both usages,
// expiring after ttl) and returns the token "<id>.<secret>".
func CreateBootstrapToken(ctx context.Context, client kubernetes.Interface, ttl time.Duration) (string, error) {
	token, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return "", err
	}
	parts := bootstraputil.BootstrapTokenRegexp.FindStringSubmatch(token)
	id, secret := parts[1], parts[2]
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstraputil.BootstrapTokenSecretName(id), Namespace: metav1.NamespaceSystem},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		StringData: map[string]string{
			bootstrapapi.BootstrapTokenIDKey:               id,
			bootstrapapi.BootstrapTokenSecretKey:           secret,
			bootstrapapi.BootstrapTokenExpirationKey:       time.Now().Add(ttl).UTC().Format(time.RFC3339),
			bootstrapapi.BootstrapTokenUsageAuthentication: "true",
			bootstrapapi.BootstrapTokenUsageSigningKey:     "true",
			bootstrapapi.BootstrapTokenExtraGroupsKey:      "system:bootstrappers:kubeadm:default-node-token",
		},
	}
	if _, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating bootstrap token Secret: %w", err)
	}
	return token, nil
}

// WaitClusterInfoSigned polls until the bootstrap signer
// (kube-controller-manager) has signed cluster-info for token id, the
// point from which `kubeadm join` discovery with that token works.
func WaitClusterInfoSigned(ctx context.Context, client kubernetes.Interface, id string) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cm, err := client.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cm.Data[bootstrapapi.JWSSignatureKeyPrefix+id] != "", nil
	})
	if err != nil {
		return fmt.Errorf("waiting for cluster-info to be signed for token %s: %w", id, err)
	}
	return nil
}
