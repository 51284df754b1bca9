package testenv

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
)

// clusterInfoReaderRole is the name kubeadm gives the Role that lets
// anonymous clients read cluster-info (kubeadm phase "bootstrap-token").
const clusterInfoReaderRole = "kubeadm:bootstrap-signer-clusterinfo"

// PublishClusterInfo creates what `kubeadm init` publishes for bootstrap-token
// discovery (kubeadm phase "bootstrap-token"): the kube-public/cluster-info
// ConfigMap holding a kubeconfig with the API server URL and cluster CA, and a
// Role and RoleBinding letting system:anonymous read it. The bootstrapsigner
// controller (Options.ControllerManager) then adds a jws-kubeconfig-<token-id>
// signature for every bootstrap token with the signing usage.
func (e *Env) PublishClusterInfo(ctx context.Context) error {
	client, err := e.Clientset()
	if err != nil {
		return err
	}
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters[""] = &clientcmdapi.Cluster{Server: e.APIServerURL, CertificateAuthorityData: e.CACertPEM}
	data, err := clientcmd.Write(*kubeconfig)
	if err != nil {
		return fmt.Errorf("encoding cluster-info kubeconfig: %w", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.ConfigMapClusterInfo, Namespace: metav1.NamespacePublic},
		Data:       map[string]string{bootstrapapi.KubeConfigKey: string(data)},
	}
	if _, err := client.CoreV1().ConfigMaps(metav1.NamespacePublic).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating cluster-info ConfigMap: %w", err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: clusterInfoReaderRole, Namespace: metav1.NamespacePublic},
		Rules: []rbacv1.PolicyRule{{
			Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{bootstrapapi.ConfigMapClusterInfo},
		}},
	}
	if _, err := client.RbacV1().Roles(metav1.NamespacePublic).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Role %s: %w", clusterInfoReaderRole, err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: clusterInfoReaderRole, Namespace: metav1.NamespacePublic},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: clusterInfoReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "system:anonymous"}},
	}
	if _, err := client.RbacV1().RoleBindings(metav1.NamespacePublic).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating RoleBinding %s: %w", clusterInfoReaderRole, err)
	}
	return nil
}
