package nodebinding

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gatehouse-dev/gatehouse/internal/configmapcache"
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
	cms *configmapcache.Cache
}

// NewCache returns the cache of the bindings kept in namespace. Its
// informer lists and watches the ConfigMaps labelled Label there.
func NewCache(client kubernetes.Interface, namespace string) *Cache {
	return &Cache{cms: configmapcache.New(client, namespace, Label, "node-name bindings",
		keepBinding, cache.Indexers{identityIndex: indexIdentity})}
}

// keepBinding keeps of a binding ConfigMap only what Identity reads.
func keepBinding(cm *corev1.ConfigMap) {
	cm.Annotations = nil
	cm.Data = map[string]string{KeyNode: cm.Data[KeyNode], KeyIdentity: cm.Data[KeyIdentity]}
}

// Start starts the informer; it stops when ctx ends.
func (c *Cache) Start(ctx context.Context) { c.cms.Start(ctx) }

// WaitForCacheSync waits until the cache holds every binding that existed
// when it started, or ctx ends.
func (c *Cache) WaitForCacheSync(ctx context.Context) error { return c.cms.WaitForCacheSync(ctx) }

// Identity returns the attestation identity node's name is bound to, as
// Store.Identity does, from the cache: an error wrapping ErrNotBound when
// the cache holds no binding for the name, or one that names another node
// or no identity.
func (c *Cache) Identity(_ context.Context, node string) (string, error) {
	cm, ok, err := c.cms.Get(Name(node))
	if err != nil {
		return "", fmt.Errorf("reading the binding of node name %s: %w", node, err)
	}
	if !ok {
		return "", fmt.Errorf("%w: node %s", ErrNotBound, node)
	}
	return boundIdentity(cm, node)
}

// NodesOf returns the node names bound to identity, from the cache.
func (c *Cache) NodesOf(identity string) ([]string, error) {
	cms, err := c.cms.ByIndex(identityIndex, identity)
	if err != nil {
		return nil, fmt.Errorf("finding the node names bound to %s: %w", identity, err)
	}
	var names []string
	for _, cm := range cms {
		if cm.Data[KeyNode] != "" {
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
