package main

import (
	"context"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestAPIServerAccepts: a real API server (envtest) takes every component,
// with the variables at their defaults, with strict field validation. The
// CRDs and the Namespace are created for real (the rest needs them); every
// other object is a server-side dry run. Then the RBAC objects are created
// for real and the manager's ServiceAccount is asked what it may do: the
// ClusterRole must cover leader election too, since there is no Role.
func TestAPIServerAccepts(t *testing.T) {
	cfg := testenv.NewEnvtest(t)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	objs := defaultObjects(t)
	created := func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "Namespace"
	}
	for _, o := range objs {
		if created(o) {
			if err := c.Create(ctx, o.DeepCopy(), client.FieldValidation("Strict")); err != nil {
				t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
	for _, o := range objs {
		if created(o) {
			continue
		}
		t.Run(o.GetKind()+" "+o.GetName(), func(t *testing.T) {
			if err := c.Create(ctx, o.DeepCopy(), client.DryRunAll, client.FieldValidation("Strict")); err != nil {
				t.Fatalf("dry-run create refused: %v", err)
			}
		})
	}

	for _, o := range objs {
		if o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" {
			if err := c.Create(ctx, o.DeepCopy()); err != nil {
				t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
	// The API server's RBAC authorizer learns of the new ClusterRole and
	// binding through its informers, a moment after they are created (an
	// immediate review was refused in 1 of 20 runs). So every allowed case
	// is asked until it is allowed, within a deadline, and the refused
	// cases are asked after them, once the binding is known to be in
	// effect (asking those until refused would pass before it is).
	sa := "system:serviceaccount:" + namespace + ":" + managerName
	allowed := func(ctx context.Context, attrs authorizationv1.ResourceAttributes) (bool, string, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &attrs,
		}}
		if err := c.Create(ctx, sar); err != nil {
			return false, "", err
		}
		return sar.Status.Allowed, sar.Status.Reason, nil
	}
	cases := []struct {
		name    string
		attrs   authorizationv1.ResourceAttributes
		allowed bool
	}{
		{"takes the leader-election Lease in its namespace", authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "create", Group: "coordination.k8s.io", Resource: "leases"}, true},
		{"renews the leader-election Lease", authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "gatehouse-capi-bootstrap.bootstrap.gatehouse.dev"}, true},
		{"records leader-election Events", authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "create", Resource: "events"}, true},
		{"watches KubeadmConfigs in every namespace", authorizationv1.ResourceAttributes{Verb: "watch", Group: "bootstrap.gatehouse.dev", Resource: "kubeadmconfigs"}, true},
		{"patches KubeadmConfig status", authorizationv1.ResourceAttributes{Namespace: "default", Verb: "patch", Group: "bootstrap.gatehouse.dev", Resource: "kubeadmconfigs", Subresource: "status"}, true},
		{"lists Secrets for its cache", authorizationv1.ResourceAttributes{Verb: "list", Resource: "secrets"}, true},
		{"writes data Secrets", authorizationv1.ResourceAttributes{Namespace: "default", Verb: "create", Resource: "secrets"}, true},
		{"watches Machines", authorizationv1.ResourceAttributes{Verb: "watch", Group: "cluster.x-k8s.io", Resource: "machines"}, true},
		{"may not list Nodes", authorizationv1.ResourceAttributes{Verb: "list", Resource: "nodes"}, false},
	}
	for _, wantAllowed := range []bool{true, false} { // the allowed cases first
		for _, tc := range cases {
			if tc.allowed != wantAllowed {
				continue
			}
			t.Run("the manager "+tc.name, func(t *testing.T) {
				var got bool
				var reason string
				err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
					var err error
					got, reason, err = allowed(ctx, tc.attrs)
					// A refused case is asked once: the allowed ones have
					// shown the binding in effect.
					return err != nil || got || !tc.allowed, err
				})
				if err != nil && !wait.Interrupted(err) {
					t.Fatal(err)
				}
				if got != tc.allowed {
					t.Fatalf("%+v: allowed %v (%s), want %v", tc.attrs, got, reason, tc.allowed)
				}
			})
		}
	}
}
