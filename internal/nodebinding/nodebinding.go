// Package nodebinding binds node names to the attestation identity of the
// machine that first took them, persisted as ConfigMaps in the join
// service's namespace (docs/joinservice.md, "Node names"). The join service
// binds joiners (Claim), the first control plane binds itself at init
// (Bind), administrators adopt the names of Nodes that joined without
// Gatehouse (Adopt), and continuous attestation checks running nodes
// against the bindings.
package nodebinding

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
)

// Node-name bindings are ConfigMaps in the join service's namespace, one per
// bound node name (docs/joinservice.md, "Node names"): every replica and
// every restart sees the same bindings, and the API server's
// resourceVersion makes a binding's first write and every rebinding atomic.
const (
	// Label marks a binding ConfigMap.
	Label = "gatehouse.dev/node-binding"
	// AnnotationAllowIdentity, set by an administrator on a binding, lets
	// exactly that attestation identity take the node name over once (a
	// reinstalled machine with a new identity). The join service clears it
	// when it rebinds and audits the change.
	AnnotationAllowIdentity = "gatehouse.dev/allow-identity"
	bindingPrefix           = "gatehouse-node-"
	// KeyNode and KeyIdentity are the binding's data: the node name and
	// the attestation identity bound to it.
	KeyNode            = "node"
	KeyIdentity        = "identity"
	keyBindingBoundAt  = "boundAt"
	keyBindingPrevious = "previousIdentity"
)

// ErrNameBound means the node name is bound to another attestation identity.
var ErrNameBound = errors.New("node name is bound to another attestation identity")

// ErrNotBound means no attestation identity holds the node name.
var ErrNotBound = errors.New("node name is bound to no attestation identity")

// Identity returns the attestation identity node's name is bound to: the
// machine that joined under that name. It returns an error wrapping
// ErrNotBound when there is no binding, or an API error.
func (b *Store) Identity(ctx context.Context, node string) (string, error) {
	cm, err := b.client.CoreV1().ConfigMaps(b.namespace).Get(ctx, Name(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("%w: node %s", ErrNotBound, node)
	}
	if err != nil {
		return "", fmt.Errorf("reading the binding of node name %s: %w", node, err)
	}
	return boundIdentity(cm, node)
}

// boundIdentity is the identity binding cm gives node, or an error wrapping
// ErrNotBound when cm does not name node with an identity.
func boundIdentity(cm *corev1.ConfigMap, node string) (string, error) {
	if cm.Data[KeyNode] != node || cm.Data[KeyIdentity] == "" {
		return "", fmt.Errorf("%w: binding ConfigMap %s/%s does not name node %s with an identity", ErrNotBound, cm.Namespace, cm.Name, node)
	}
	return cm.Data[KeyIdentity], nil
}

// Name returns the name of node's binding ConfigMap:
// "gatehouse-node-" and the first 32 hex digits of SHA-256(node), a fixed
// length whatever the node name's.
func Name(node string) string {
	sum := sha256.Sum256([]byte(node))
	return bindingPrefix + hex.EncodeToString(sum[:16])
}

// Store binds node names to attestation identities on first use,
// persisted in the Kubernetes API. It is safe for concurrent use.
type Store struct {
	client    kubernetes.Interface
	namespace string
	now       func() time.Time
}

// New returns the bindings kept in namespace.
func New(client kubernetes.Interface, namespace string, now func() time.Time) *Store {
	return &Store{client: client, namespace: namespace, now: now}
}

// Binding is the outcome of Bind and Claim.
type Binding struct {
	// Rebound is set when an administrator's AnnotationAllowIdentity moved
	// the name from PreviousIdentity to the caller.
	Rebound          bool
	PreviousIdentity string
	// Adoption is set when the name was bound under an administrator's
	// adoption (Adopt): who adopted it, and when.
	Adoption *Adoption
}

// Bind binds node to identity, or checks that it is bound to it, for a
// caller already entitled to the name whether or not a Node holds it: the
// first control plane at init, admitted by the init secret, binding the
// name of the Node kubeadm init has just registered for it. Machines that
// ask to join go through Claim, which also refuses a name an existing Node
// holds. Bind returns an error wrapping ErrNameBound when another identity
// holds the name and no administrator allowed this identity to take it
// over, or an API error. Two replicas binding the same name at once cannot
// both win: creation and updates are conditional.
func (b *Store) Bind(ctx context.Context, node, identity string) (Binding, error) {
	return b.bind(ctx, node, identity, false)
}

// bind binds node to identity; with guard (Claim) it also refuses a name
// held by a Node without a binding, unless an adoption admits identity.
func (b *Store) bind(ctx context.Context, node, identity string, guard bool) (Binding, error) {
	if identity == "" {
		return Binding{}, fmt.Errorf("binding node name %s: no attestation identity given", node)
	}
	held := false
	if guard {
		var err error
		if held, err = b.nodeExists(ctx, node); err != nil {
			return Binding{}, err
		}
	}
	cms := b.client.CoreV1().ConfigMaps(b.namespace)
	name := Name(node)
	// Most names are new: create first, one API call, and read only when
	// the name is taken. A name a Node holds is read first instead, so
	// that its refusal writes nothing.
	fresh := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.namespace, Labels: map[string]string{Label: "true"}},
		Data: map[string]string{
			KeyNode: node, KeyIdentity: identity,
			keyBindingBoundAt: b.now().UTC().Format(time.RFC3339),
		},
	}
	if !held {
		created, err := cms.Create(ctx, fresh, metav1.CreateOptions{})
		if err == nil {
			return Binding{}, b.settle(ctx, guard, node, created)
		}
		if !apierrors.IsAlreadyExists(err) {
			return Binding{}, fmt.Errorf("binding node name %s: %w", node, err)
		}
	}
	for range 3 {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if held {
				return Binding{}, heldError(node)
			}
			// Deleted since (an administrator freed the name): bind it.
			created, err := cms.Create(ctx, fresh, metav1.CreateOptions{})
			if err == nil {
				return Binding{}, b.settle(ctx, guard, node, created)
			} else if !apierrors.IsAlreadyExists(err) {
				return Binding{}, fmt.Errorf("binding node name %s: %w", node, err)
			}
			continue
		}
		if err != nil {
			return Binding{}, fmt.Errorf("reading the binding of node name %s: %w", node, err)
		}
		if cm.Data[KeyNode] != node {
			return Binding{}, fmt.Errorf("binding ConfigMap %s/%s holds node %q, not %q; remove it", b.namespace, name, cm.Data[KeyNode], node)
		}
		bound := cm.Data[KeyIdentity]
		var out Binding
		switch {
		case bound == identity:
			return Binding{}, nil
		case bound != "":
			if cm.Annotations[AnnotationAllowIdentity] != identity {
				return Binding{}, fmt.Errorf("%w: node name %s belongs to %s; if this machine was reinstalled, an administrator annotates ConfigMap %s/%s with %s=%s",
					ErrNameBound, node, bound, b.namespace, name, AnnotationAllowIdentity, identity)
			}
			out = Binding{Rebound: true, PreviousIdentity: bound}
		default:
			// No identity: adopted by an administrator, or released.
			a, adopted, err := adoptionOf(cm)
			switch {
			case err != nil:
				return Binding{}, fmt.Errorf("%w: %w", ErrNameHeld, err)
			case adopted && guard:
				if err := a.admits(node, identity, b.now()); err != nil {
					return Binding{}, err
				}
				out.Adoption = &a
			case adopted:
				out.Adoption = &a
			case held:
				return Binding{}, heldError(node)
			}
		}
		cm = cm.DeepCopy()
		delete(cm.Annotations, AnnotationAllowIdentity)
		delete(cm.Annotations, AnnotationAdoptedUntil)
		cm.Data[KeyIdentity] = identity
		cm.Data[keyBindingBoundAt] = b.now().UTC().Format(time.RFC3339)
		if out.Rebound {
			cm.Data[keyBindingPrevious] = bound
		}
		updated, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return Binding{}, fmt.Errorf("binding node name %s: %w", node, err)
		}
		if bound == "" && out.Adoption == nil {
			// A released name bound afresh: as a new binding.
			return out, b.settle(ctx, guard, node, updated)
		}
		return out, nil
	}
	return Binding{}, fmt.Errorf("binding node name %s: the binding kept changing; retry", node)
}
