package nodebinding

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Cache reads the bindings from an informer's cache of the binding
// ConfigMaps (those labelled Label in the namespace). Continuous
// attestation asks for every node's binding every round: from the cache,
// that costs the API server nothing, where a GET per node would be a
// request per re-verification. The informer's watch keeps it current
// within moments of a bind; a binding the join service has just made may
// be missing for that long. Start it, and WaitForCacheSync, before use.
// It is safe for concurrent use.
type Cache struct {
	namespace string
	factory   informers.SharedInformerFactory
	informer  cache.SharedIndexInformer
}

// NewCache returns the cache of the bindings kept in namespace. Its
// informer lists and watches the ConfigMaps labelled Label there.
func NewCache(client kubernetes.Interface, namespace string) *Cache {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = Label + "=true" }),
		informers.WithTransform(keepBinding))
	informer := factory.Core().V1().ConfigMaps().Informer()
	// Only fails once the informer has started.
	_ = informer.AddIndexers(cache.Indexers{identityIndex: indexIdentity})
	return &Cache{namespace: namespace, factory: factory, informer: informer}
}

// keepBinding keeps of a binding ConfigMap only what Identity reads.
func keepBinding(obj any) (any, error) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return obj, nil // a deletion's tombstone
	}
	cm.ManagedFields = nil
	cm.Annotations = nil
	cm.Data = map[string]string{KeyNode: cm.Data[KeyNode], KeyIdentity: cm.Data[KeyIdentity]}
	return cm, nil
}

// Start starts the informer; it stops when ctx ends.
func (c *Cache) Start(ctx context.Context) { c.factory.Start(ctx.Done()) }

// WaitForCacheSync waits until the cache holds every binding that existed
// when it started, or ctx ends.
func (c *Cache) WaitForCacheSync(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("waiting for the node-name bindings in %s: %w", c.namespace, context.Cause(ctx))
	}
	return nil
}

// errNotSynced means the cache was asked before it had synced: it cannot
// tell a missing binding yet.
var errNotSynced = errors.New("the cache of node-name bindings has not synced yet")

// Identity returns the attestation identity node's name is bound to, as
// Store.Identity does, from the cache: an error wrapping ErrNotBound when
// the cache holds no binding for the name, or one that names another node
// or no identity.
func (c *Cache) Identity(_ context.Context, node string) (string, error) {
	if !c.informer.HasSynced() {
		return "", fmt.Errorf("reading the binding of node name %s: %w", node, errNotSynced)
	}
	obj, ok, err := c.informer.GetStore().GetByKey(c.namespace + "/" + Name(node))
	if err != nil {
		return "", fmt.Errorf("reading the binding of node name %s: %w", node, err)
	}
	if !ok {
		return "", fmt.Errorf("%w: node %s", ErrNotBound, node)
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return "", fmt.Errorf("reading the binding of node name %s: cached %T", node, obj)
	}
	return boundIdentity(cm, node)
}

// NodesOf returns the node names bound to identity, from the cache.
func (c *Cache) NodesOf(identity string) ([]string, error) {
	if !c.informer.HasSynced() {
		return nil, fmt.Errorf("finding the node names bound to %s: %w", identity, errNotSynced)
	}
	objs, err := c.informer.GetIndexer().ByIndex(identityIndex, identity)
	if err != nil {
		return nil, fmt.Errorf("finding the node names bound to %s: %w", identity, err)
	}
	var names []string
	for _, obj := range objs {
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Data[KeyNode] != "" {
			names = append(names, cm.Data[KeyNode])
		}
	}
	return names, nil
}

// identityIndex indexes the cached bindings by their identity.
const identityIndex = "identity"

func indexIdentity(obj any) ([]string, error) {
	if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Data[KeyIdentity] != "" {
		return []string{cm.Data[KeyIdentity]}, nil
	}
	return nil, nil
}
