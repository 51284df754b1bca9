package kubeadm_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestControllerManagerApprovesNothing runs a real kube-controller-manager
// with the --controllers our init configuration gives it, in a cluster
// holding kubeadm's node-autoapprove ClusterRoleBindings (kubeadm init and
// `kubeadm upgrade apply` create them): a node's client certificate
// renewal is never approved by it, while the controller manager signs a
// request an administrator approved meanwhile (so it was running and
// watching the requests). With kubeadm's default controllers, csrapproving
// approves the renewal within moments.
func TestControllerManagerApprovesNothing(t *testing.T) {
	config, err := initParams("10.0.0.10").Render()
	if err != nil {
		t.Fatal(err)
	}
	controllers := ""
	for _, doc := range strings.Split(string(config), "\n---\n") {
		var cluster struct {
			Kind              string `json:"kind"`
			ControllerManager struct {
				ExtraArgs []struct{ Name, Value string } `json:"extraArgs"`
			} `json:"controllerManager"`
		}
		if err := yaml.Unmarshal([]byte(doc), &cluster); err != nil || cluster.Kind != "ClusterConfiguration" {
			continue
		}
		for _, a := range cluster.ControllerManager.ExtraArgs {
			if a.Name == "controllers" {
				controllers = a.Value
			}
		}
	}
	if controllers != kubeadm.ControllerManagerControllers {
		t.Fatalf("the init configuration sets --controllers %q, want %q (kubeadm's default runs csrapproving)", controllers, kubeadm.ControllerManagerControllers)
	}
	env := testenv.New(t, testenv.Options{ControllerManager: true, Controllers: strings.Split(controllers, ",")})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, b := range []struct{ name, role, group string }{
		{"kubeadm:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes"},
		{"kubeadm:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", "system:bootstrappers:kubeadm:default-node-token"},
	} {
		if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: b.group}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c := rest.CopyConfig(env.Config)
	c.Impersonate = rest.ImpersonationConfig{UserName: "system:node:worker-1", Groups: []string{"system:nodes", "system:authenticated"}}
	asNode, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	create := func(cs kubernetes.Interface, name, node string) {
		t.Helper()
		if _, err := cs.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certificatesv1.CertificateSigningRequestSpec{Request: clientCSR(t, node),
				SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName, Usages: usages},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(asNode, "renewal", "worker-1")
	create(client, "approved-by-hand", "worker-2")
	approved, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, "approved-by-hand", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	approved.Status.Conditions = append(approved.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ByHand", Message: "the test approves it"})
	if _, err := client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, "approved-by-hand", approved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		csr, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, "approved-by-hand", metav1.GetOptions{})
		return err == nil && len(csr.Status.Certificate) > 0, nil
	})
	if err != nil {
		t.Fatalf("the controller manager never signed the approved request: %v", err)
	}
	renewal, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, "renewal", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(renewal.Status.Conditions) > 0 || len(renewal.Status.Certificate) > 0 {
		t.Errorf("the controller manager decided the node's renewal itself: %+v", renewal.Status.Conditions)
	}
}

// clientCSR is a kubelet client certificate request of node, PEM.
func clientCSR(t *testing.T, node string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
