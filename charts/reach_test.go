package charts

import (
	"context"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// access is one question to the API server's authorizer.
type access struct {
	name  string
	attrs authorizationv1.ResourceAttributes
}

func secretsIn(ns, verb, name string) authorizationv1.ResourceAttributes {
	return authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: "secrets", Name: name}
}

// TestServiceAccountReach installs the charts' ServiceAccounts and RBAC on a
// real API server and asks its authorizer (SubjectAccessReview, what
// `kubectl auth can-i --as` does) whether each Gatehouse ServiceAccount can
// do what it needs, and nothing on the list of what it must never do: a
// compromised join service must not reach the master secret, Secrets it
// does not write, or anything that widens its rights.
func TestServiceAccountReach(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range Names {
		manifest, err := renderIn(t, name, testValues[name], Namespace)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(manifest, "\n---\n") {
			o := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil {
				t.Fatal(err)
			}
			switch o.GetKind() {
			case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
				if err := c.Create(ctx, o); err != nil {
					t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
		}
	}
	const ks = "kube-system"
	sas := []struct {
		name        string
		can, cannot []access
	}{
		{
			name: "gatehouse-joinservice",
			can: []access{
				{"reads the join config", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "get", Resource: "configmaps", Name: "gatehouse-join-config"}},
				{"watches the deny list by name", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "watch", Resource: "configmaps", Name: "gatehouse-deny-list"}},
				{"creates node-name bindings", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "create", Resource: "configmaps"}},
				{"updates a node-name binding", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "update", Resource: "configmaps", Name: "gatehouse-node-0123"}},
				{"lists node-name bindings (by label, which RBAC cannot narrow)", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "list", Resource: "configmaps"}},
				{"watches node-name bindings", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "watch", Resource: "configmaps"}},
				{"creates the control-plane join Lease", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "create", Group: "coordination.k8s.io", Resource: "leases"}},
				{"takes the control-plane join Lease", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "gatehouse-control-plane-join"}},
				{"creates bootstrap token Secrets", secretsIn(ks, "create", "")},
				{"renews its bootstrap token Secret", secretsIn(ks, "update", "bootstrap-token-abcdef")},
				{"reads Nodes", authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Name: "cp-1"}},
				{"lists Nodes to re-verify them", authorizationv1.ResourceAttributes{Verb: "list", Resource: "nodes"}},
				{"watches Nodes to re-verify them", authorizationv1.ResourceAttributes{Verb: "watch", Resource: "nodes"}},
				{"records a Node's attestation condition", authorizationv1.ResourceAttributes{Verb: "patch", Resource: "nodes", Subresource: "status", Name: "cp-1"}},
				{"taints a Node that stopped proving itself", authorizationv1.ResourceAttributes{Verb: "patch", Resource: "nodes", Name: "cp-1"}},
				{"records Events on Nodes", authorizationv1.ResourceAttributes{Namespace: "default", Verb: "create", Group: "events.k8s.io", Resource: "events"}},
				{"takes the continuous attestation Lease", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "gatehouse-reattest"}},
				{"watches CSRs", authorizationv1.ResourceAttributes{Verb: "watch", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}},
				{"decides CSRs", authorizationv1.ResourceAttributes{Verb: "update", Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "approval", Name: "csr-1"}},
				{"approves kubelet client renewals", authorizationv1.ResourceAttributes{Verb: "approve", Group: "certificates.k8s.io", Resource: "signers", Name: "kubernetes.io/kube-apiserver-client-kubelet"}},
				{"approves kubelet serving certificates", authorizationv1.ResourceAttributes{Verb: "approve", Group: "certificates.k8s.io", Resource: "signers", Name: "kubernetes.io/kubelet-serving"}},
				{"removes kubeadm's automatic approval of renewals", authorizationv1.ResourceAttributes{Verb: "delete", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings", Name: "kubeadm:node-autoapprove-certificate-rotation"}},
				{"removes kubeadm's automatic approval of first certificates", authorizationv1.ResourceAttributes{Verb: "delete", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings", Name: "kubeadm:node-autoapprove-bootstrap"}},
				{"reads a bootstrap token's node", authorizationv1.ResourceAttributes{Namespace: "kube-system", Verb: "get", Resource: "secrets", Name: "bootstrap-token-abcdef"}},
			},
			cannot: []access{
				{"read the master secret", secretsIn(Namespace, "get", "gatehouse-kms")},
				{"read the key service's TLS key", secretsIn(Namespace, "get", "gatehouse-keyservice-tls")},
				{"list Secrets in its namespace", secretsIn(Namespace, "list", "")},
				{"list bootstrap token Secrets", secretsIn(ks, "list", "")},
				{"watch Secrets in kube-system", secretsIn(ks, "watch", "")},
				{"delete Secrets in kube-system", secretsIn(ks, "delete", "bootstrap-token-abcdef")},
				{"read Secrets in another namespace", secretsIn("default", "get", "anything")},
				{"list ConfigMaps in kube-system", authorizationv1.ResourceAttributes{Namespace: ks, Verb: "list", Resource: "configmaps"}},
				{"watch ConfigMaps in another namespace", authorizationv1.ResourceAttributes{Namespace: "default", Verb: "watch", Resource: "configmaps"}},
				{"delete a node-name binding", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "delete", Resource: "configmaps", Name: "gatehouse-node-0123"}},
				{"rewrite kubeadm's configuration", authorizationv1.ResourceAttributes{Namespace: ks, Verb: "update", Resource: "configmaps", Name: "kubeadm-config"}},
				{"evict Pods (drain a node)", authorizationv1.ResourceAttributes{Namespace: "default", Verb: "create", Resource: "pods", Subresource: "eviction"}},
				{"rewrite cluster-info", authorizationv1.ResourceAttributes{Namespace: "kube-public", Verb: "update", Resource: "configmaps", Name: "cluster-info"}},
				{"take another component's Lease", authorizationv1.ResourceAttributes{Namespace: ks, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "kube-controller-manager"}},
				{"take any Lease in its namespace", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "other"}},
				{"create Pods", authorizationv1.ResourceAttributes{Namespace: ks, Verb: "create", Resource: "pods"}},
				{"exec into Pods", authorizationv1.ResourceAttributes{Namespace: ks, Verb: "create", Resource: "pods", Subresource: "exec"}},
				{"delete Nodes", authorizationv1.ResourceAttributes{Verb: "delete", Resource: "nodes", Name: "cp-1"}},
				{"update Node status wholesale", authorizationv1.ResourceAttributes{Verb: "update", Resource: "nodes", Subresource: "status", Name: "cp-1"}},
				{"create CSRs", authorizationv1.ResourceAttributes{Verb: "create", Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}},
				{"approve for a signer other than the kubelets'", authorizationv1.ResourceAttributes{Verb: "approve", Group: "certificates.k8s.io", Resource: "signers", Name: "kubernetes.io/kube-apiserver-client"}},
				{"delete another ClusterRoleBinding", authorizationv1.ResourceAttributes{Verb: "delete", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings", Name: "kubeadm:kubelet-bootstrap"}},
				{"escalate a Role", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "escalate", Group: "rbac.authorization.k8s.io", Resource: "roles"}},
				{"bind a ClusterRole", authorizationv1.ResourceAttributes{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}},
				{"impersonate users", authorizationv1.ResourceAttributes{Verb: "impersonate", Resource: "users"}},
				{"mint ServiceAccount tokens", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "create", Resource: "serviceaccounts", Subresource: "token"}},
			},
		},
		{
			name: "gatehouse-keyservice",
			cannot: []access{
				{"read the master secret through the API (it is mounted)", secretsIn(Namespace, "get", "gatehouse-kms")},
				{"list Secrets", secretsIn(Namespace, "list", "")},
				{"read Secrets in kube-system", secretsIn(ks, "get", "bootstrap-token-abcdef")},
				{"read ConfigMaps", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "get", Resource: "configmaps", Name: "gatehouse-join-config"}},
				{"read Nodes", authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes"}},
				{"create Pods", authorizationv1.ResourceAttributes{Namespace: Namespace, Verb: "create", Resource: "pods"}},
			},
		},
	}
	// The authorizer learns of the charts' Roles and bindings through its
	// informers, a moment after they are created: every allowed case is
	// asked until it is allowed, within a deadline, and the refused cases,
	// which would pass before the bindings are in effect, only after all
	// of those.
	ask := func(t *testing.T, name string, a access, want bool) {
		t.Helper()
		var got bool
		var reason string
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               "system:serviceaccount:" + Namespace + ":" + name,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + Namespace, "system:authenticated"},
				ResourceAttributes: &a.attrs,
			}}
			if err := c.Create(ctx, sar); err != nil {
				return false, err
			}
			got, reason = sar.Status.Allowed, sar.Status.Reason
			return got || !want, nil
		})
		if err != nil && !wait.Interrupted(err) {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%+v: allowed %v (%s), want %v", a.attrs, got, reason, want)
		}
	}
	for _, sa := range sas {
		for _, a := range sa.can {
			t.Run(sa.name+" "+a.name, func(t *testing.T) { ask(t, sa.name, a, true) })
		}
	}
	for _, sa := range sas {
		for _, a := range sa.cannot {
			t.Run(sa.name+" must not "+a.name, func(t *testing.T) { ask(t, sa.name, a, false) })
		}
	}
}
