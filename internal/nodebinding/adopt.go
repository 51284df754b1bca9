package nodebinding

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// A Node that joined without Gatehouse (with an administrator's bootstrap
// token, or before Gatehouse was installed) holds its name without a
// binding. No attested machine may bind such a name on its own: it would
// receive credentials that authenticate as that Node. An administrator
// adopts the name first (gatehouse node adopt, docs/joinservice.md, "Nodes
// that joined without Gatehouse"): the binding ConfigMap then exists
// without an identity, annotated with who adopted it, when, and until
// when; the next attested machine joining under the name binds it.
const (
	// AnnotationAdoptedBy is who adopted the name: the administrator's
	// Kubernetes user name.
	AnnotationAdoptedBy = "gatehouse.dev/adopted-by"
	// AnnotationAdoptedAt is when, in RFC 3339.
	AnnotationAdoptedAt = "gatehouse.dev/adopted-at"
	// AnnotationAdoptedUntil is when an adoption no machine has used
	// lapses, in RFC 3339; it is removed when a machine binds the name.
	AnnotationAdoptedUntil = "gatehouse.dev/adopted-until"
)

// ErrNameHeld means a Node of that name exists and no attestation identity
// is bound to its name (it joined without Gatehouse), and no administrator
// adopted the name for the caller.
var ErrNameHeld = errors.New("node name is held by a Node that joined without Gatehouse")

// releaseTimeout bounds the release of a binding after a Node appeared
// (settle), which runs even when the caller's context has ended.
const releaseTimeout = 10 * time.Second

// Adoption is an administrator's permission for the next attested machine
// that joins under a node name to bind it, although a Node of that name
// may exist that no identity is bound to.
type Adoption struct {
	// By is who adopted the name: the administrator's Kubernetes user name.
	By string
	// At is when the name was adopted; Until is when the adoption lapses
	// if no machine has bound the name by then.
	At, Until time.Time
	// Identity, when set, is the only attestation identity that may bind
	// the name ("tpm-ak:sha256:<hex>"); empty admits any attested machine
	// the join policy admits.
	Identity string
}

// Claim binds node to identity for a machine that asks to join under the
// name, as Bind does, and refuses a name held by an existing Node that no
// identity is bound to unless an administrator adopted it (Adopt) for this
// identity and the adoption has not lapsed. It returns an error wrapping
// ErrNameHeld for such a name, with nothing written; ErrNameBound as Bind;
// or an API error. The Node is looked up before the binding is written and
// again after: a Node registered in between makes Claim release the
// binding it wrote (the ConfigMap stays, bound to no identity) and refuse.
// Reads the Node of that name (nodes get).
func (b *Store) Claim(ctx context.Context, node, identity string) (Binding, error) {
	return b.bind(ctx, node, identity, true)
}

// Adopt records a, an administrator's adoption, on node's name, replacing
// an earlier adoption no machine has used yet, which it returns (nil when
// there was none). It returns an error wrapping ErrNameBound when an
// identity is bound to the name (an adoption is for names no machine is
// bound to; a bound name is handed to a reinstalled machine with
// AnnotationAllowIdentity), an error naming what is wrong with node or a,
// or an API error.
func (b *Store) Adopt(ctx context.Context, node string, a Adoption) (*Adoption, error) {
	if msgs := validation.IsDNS1123Subdomain(node); len(msgs) > 0 {
		return nil, fmt.Errorf("%q is not a node name: %s", node, strings.Join(msgs, "; "))
	}
	if a.By == "" || a.At.IsZero() || !a.Until.After(a.At) {
		return nil, fmt.Errorf("adopting node name %s: an adoption needs who adopted it, when, and a later end (got %q, %v, %v)", node, a.By, a.At, a.Until)
	}
	cms := b.client.CoreV1().ConfigMaps(b.namespace)
	name := Name(node)
	annotations := map[string]string{
		AnnotationAdoptedBy:    a.By,
		AnnotationAdoptedAt:    a.At.UTC().Format(time.RFC3339),
		AnnotationAdoptedUntil: a.Until.UTC().Format(time.RFC3339),
	}
	if a.Identity != "" {
		annotations[AnnotationAllowIdentity] = a.Identity
	}
	fresh := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.namespace, Labels: map[string]string{Label: "true"}, Annotations: annotations},
		Data:       map[string]string{KeyNode: node},
	}
	for range 3 {
		_, err := cms.Create(ctx, fresh, metav1.CreateOptions{})
		if err == nil {
			return nil, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("adopting node name %s: %w", node, err)
		}
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the binding of node name %s: %w", node, err)
		}
		if cm.Data[KeyNode] != node {
			return nil, fmt.Errorf("binding ConfigMap %s/%s holds node %q, not %q; remove it", b.namespace, name, cm.Data[KeyNode], node)
		}
		if bound := cm.Data[KeyIdentity]; bound != "" {
			return nil, fmt.Errorf("%w: node name %s is bound to %s since %s, so there is nothing to adopt; to let a reinstalled machine take it over, annotate ConfigMap %s/%s with %s=<its identity> (docs/joinservice.md, \"Node names\")",
				ErrNameBound, node, bound, cm.Data[keyBindingBoundAt], b.namespace, name, AnnotationAllowIdentity)
		}
		previous, adopted, err := adoptionOf(cm)
		adopted = adopted && err == nil // a malformed adoption is replaced
		cm = cm.DeepCopy()
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		delete(cm.Annotations, AnnotationAllowIdentity)
		maps.Copy(cm.Annotations, annotations)
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); apierrors.IsConflict(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("adopting node name %s: %w", node, err)
		}
		if !adopted {
			return nil, nil
		}
		return &previous, nil
	}
	return nil, fmt.Errorf("adopting node name %s: the binding kept changing; retry", node)
}

// nodeExists reports whether a Node named node exists.
func (b *Store) nodeExists(ctx context.Context, node string) (bool, error) {
	_, err := b.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking up Node %s: %w", node, err)
	}
	return true, nil
}

// heldError is the refusal of a name a Node holds without a binding.
func heldError(node string) error {
	return fmt.Errorf("%w: Node %s exists and no attestation identity is bound to its name (it joined with a bootstrap token of an administrator, or before Gatehouse); if this machine is to take that name over, an administrator runs `gatehouse node adopt %s` first (docs/joinservice.md, \"Nodes that joined without Gatehouse\")",
		ErrNameHeld, node, node)
}

// settle runs after Claim bound node afresh in cm: when a Node of that name
// was registered between the check and the bind, it releases the binding
// (removes cm's identity, only if cm is still as written) and refuses. A
// failed lookup releases it too: the name may be held.
func (b *Store) settle(ctx context.Context, guard bool, node string, cm *corev1.ConfigMap) error {
	if !guard {
		return nil
	}
	held, err := b.nodeExists(ctx, node)
	if err == nil && !held {
		return nil
	}
	if err == nil {
		err = heldError(node)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	released := cm.DeepCopy()
	delete(released.Data, KeyIdentity)
	delete(released.Data, keyBindingBoundAt)
	if _, uerr := b.client.CoreV1().ConfigMaps(b.namespace).Update(ctx, released, metav1.UpdateOptions{}); uerr != nil {
		return fmt.Errorf("%w; releasing the binding this request wrote failed, so an administrator removes ConfigMap %s/%s: %w", err, b.namespace, cm.Name, uerr)
	}
	return err
}

// adoptionOf returns the adoption recorded on a binding ConfigMap, and
// whether there is one; an error when its annotations are malformed.
func adoptionOf(cm *corev1.ConfigMap) (Adoption, bool, error) {
	by, ok := cm.Annotations[AnnotationAdoptedBy]
	if !ok {
		return Adoption{}, false, nil
	}
	a := Adoption{By: by, Identity: cm.Annotations[AnnotationAllowIdentity]}
	var err error
	if a.At, err = time.Parse(time.RFC3339, cm.Annotations[AnnotationAdoptedAt]); err != nil {
		return Adoption{}, true, fmt.Errorf("binding ConfigMap %s/%s: annotation %s: %w; adopt the name again", cm.Namespace, cm.Name, AnnotationAdoptedAt, err)
	}
	if a.Until, err = time.Parse(time.RFC3339, cm.Annotations[AnnotationAdoptedUntil]); err != nil {
		return Adoption{}, true, fmt.Errorf("binding ConfigMap %s/%s: annotation %s: %w; adopt the name again", cm.Namespace, cm.Name, AnnotationAdoptedUntil, err)
	}
	return a, true, nil
}

// admits returns nil when a lets identity bind node at now, else an error
// wrapping ErrNameHeld that says why not.
func (a Adoption) admits(node, identity string, now time.Time) error {
	if !now.Before(a.Until) {
		return fmt.Errorf("%w: the adoption of node name %s by %s at %s lapsed at %s unused; to let this machine take it over, an administrator runs `gatehouse node adopt %s` again",
			ErrNameHeld, node, a.By, a.At.Format(time.RFC3339), a.Until.Format(time.RFC3339), node)
	}
	if a.Identity != "" && a.Identity != identity {
		return fmt.Errorf("%w: node name %s was adopted by %s for identity %s only", ErrNameHeld, node, a.By, a.Identity)
	}
	return nil
}
