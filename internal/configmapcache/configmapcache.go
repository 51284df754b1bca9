// Package configmapcache keeps an informer's cache of the ConfigMaps that
// carry one label (value "true") in one namespace: the records Gatehouse
// keeps per node (package nodeattestation) and the node-name bindings
// (package nodebinding) are read on every credential decision and every
// re-verification, and a GET each would cost the API server a request per
// decision. The watch keeps the cache current within moments of a write.
package configmapcache

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

// errNotSynced means the cache was asked before it had synced: it cannot
// tell a missing ConfigMap yet. Errors of a Cache wrap it.
var errNotSynced = errors.New("not synced yet")

// notSynced is errNotSynced naming what the cache holds.
type notSynced struct{ what string }

func (e notSynced) Error() string        { return "the cache of " + e.what + " has not synced yet" }
func (e notSynced) Is(target error) bool { return target == errNotSynced }

// Cache is the informer cache of one label's ConfigMaps in one namespace.
// Start it, and WaitForCacheSync, before use. It is safe for concurrent use.
type Cache struct {
	namespace string
	what      string
	factory   informers.SharedInformerFactory
	informer  cache.SharedIndexInformer
}

// New returns the cache of the ConfigMaps labelled label=true in
// namespace; what names them in errors ("attestation records").
// Managed fields are dropped from every cached ConfigMap; trim, when not
// nil, may drop more of it (the cache then holds only what trim left).
// indexers, when not nil, index the cache for ByIndex.
func New(client kubernetes.Interface, namespace, label, what string, trim func(*corev1.ConfigMap), indexers cache.Indexers) *Cache {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = label + "=true" }),
		informers.WithTransform(func(obj any) (any, error) {
			if cm, ok := obj.(*corev1.ConfigMap); ok { // not a deletion's tombstone
				cm.ManagedFields = nil
				if trim != nil {
					trim(cm)
				}
			}
			return obj, nil
		}))
	informer := factory.Core().V1().ConfigMaps().Informer()
	if indexers != nil {
		// Only fails once the informer has started.
		_ = informer.AddIndexers(indexers)
	}
	return &Cache{namespace: namespace, what: what, factory: factory, informer: informer}
}

// Start starts the informer; it stops when ctx ends.
func (c *Cache) Start(ctx context.Context) { c.factory.Start(ctx.Done()) }

// WaitForCacheSync waits until the cache holds every ConfigMap that existed
// when it started, or ctx ends.
func (c *Cache) WaitForCacheSync(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("waiting for the %s in %s: %w", c.what, c.namespace, context.Cause(ctx))
	}
	return nil
}

// Get returns the cached ConfigMap called name; ok is false when the cache
// holds none. The ConfigMap is the cache's own: do not modify it.
func (c *Cache) Get(name string) (cm *corev1.ConfigMap, ok bool, err error) {
	if !c.informer.HasSynced() {
		return nil, false, notSynced{c.what}
	}
	obj, ok, err := c.informer.GetStore().GetByKey(c.namespace + "/" + name)
	if err != nil || !ok {
		return nil, false, err
	}
	if cm, ok = obj.(*corev1.ConfigMap); !ok {
		return nil, false, fmt.Errorf("cached %T", obj)
	}
	return cm, true, nil
}

// List returns every cached ConfigMap (the cache's own: do not modify them).
func (c *Cache) List() ([]*corev1.ConfigMap, error) {
	if !c.informer.HasSynced() {
		return nil, notSynced{c.what}
	}
	return configMaps(c.informer.GetStore().List()), nil
}

// ByIndex returns the cached ConfigMaps whose index values include value.
func (c *Cache) ByIndex(index, value string) ([]*corev1.ConfigMap, error) {
	if !c.informer.HasSynced() {
		return nil, notSynced{c.what}
	}
	objs, err := c.informer.GetIndexer().ByIndex(index, value)
	if err != nil {
		return nil, err
	}
	return configMaps(objs), nil
}

// OnChange calls f with every ConfigMap added, changed or deleted, until
// remove is called.
func (c *Cache) OnChange(f func(*corev1.ConfigMap)) (remove func(), err error) {
	call := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			f(cm)
		}
	}
	reg, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: call, UpdateFunc: func(_, obj any) { call(obj) }, DeleteFunc: call,
	})
	if err != nil {
		return nil, err
	}
	return func() { _ = c.informer.RemoveEventHandler(reg) }, nil
}

func configMaps(objs []any) []*corev1.ConfigMap {
	out := make([]*corev1.ConfigMap, 0, len(objs))
	for _, obj := range objs {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			out = append(out, cm)
		}
	}
	return out
}
