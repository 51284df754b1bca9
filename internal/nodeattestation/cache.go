package nodeattestation

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

// Cache reads the records from an informer's cache of the record
// ConfigMaps (those labelled Label in the namespace): every credential
// decision reads a record, and a GET each would cost the API server a
// request per decision. The watch keeps it current within moments of a
// write. Start it, and WaitForCacheSync, before use. It is safe for
// concurrent use.
type Cache struct {
	namespace string
	factory   informers.SharedInformerFactory
	informer  cache.SharedIndexInformer
}

// NewCache returns the cache of the records kept in namespace.
func NewCache(client kubernetes.Interface, namespace string) *Cache {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = Label + "=true" }),
		informers.WithTransform(func(obj any) (any, error) {
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				cm.ManagedFields = nil
			}
			return obj, nil
		}))
	return &Cache{namespace: namespace, factory: factory, informer: factory.Core().V1().ConfigMaps().Informer()}
}

// Start starts the informer; it stops when ctx ends.
func (c *Cache) Start(ctx context.Context) { c.factory.Start(ctx.Done()) }

// WaitForCacheSync waits until the cache holds every record that existed
// when it started, or ctx ends.
func (c *Cache) WaitForCacheSync(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("waiting for the attestation records in %s: %w", c.namespace, context.Cause(ctx))
	}
	return nil
}

// OnChange calls f with the node name of every record added, changed or
// deleted (for example to mirror it onto the Node at once), until remove
// is called.
func (c *Cache) OnChange(f func(node string)) (remove func(), err error) {
	call := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Data[keyNode] != "" {
			f(cm.Data[keyNode])
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

// errNotSynced means the cache was asked before it had synced: it cannot
// tell a missing record yet.
var errNotSynced = errors.New("the cache of attestation records has not synced yet")

// Get returns node's record from the cache, or an error wrapping
// ErrNoRecord when it holds none.
func (c *Cache) Get(node string) (Record, error) {
	cur, err := c.Current(node)
	if err == nil && !cur.Exists {
		err = fmt.Errorf("%w of node %s", ErrNoRecord, node)
	}
	return cur.Record, err
}

// Current returns node's record as cached, with its resourceVersion for a
// conditional write (Store.Update); Exists is false when the cache holds
// none.
func (c *Cache) Current(node string) (Current, error) {
	if !c.informer.HasSynced() {
		return Current{}, fmt.Errorf("reading the attestation record of node %s: %w", node, errNotSynced)
	}
	obj, ok, err := c.informer.GetStore().GetByKey(c.namespace + "/" + Name(node))
	if err != nil {
		return Current{}, fmt.Errorf("reading the attestation record of node %s: %w", node, err)
	}
	if !ok {
		return Current{}, nil
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return Current{}, fmt.Errorf("reading the attestation record of node %s: cached %T", node, obj)
	}
	r, err := FromConfigMap(cm, node)
	if err != nil {
		return Current{}, err
	}
	return Current{Record: r, Exists: true, ResourceVersion: cm.ResourceVersion}, nil
}

// List returns every cached record, each with its resourceVersion.
func (c *Cache) List() ([]Current, error) {
	if !c.informer.HasSynced() {
		return nil, fmt.Errorf("listing the attestation records: %w", errNotSynced)
	}
	var out []Current
	for _, obj := range c.informer.GetStore().List() {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			continue
		}
		r, err := FromConfigMap(cm, "")
		if err != nil {
			continue // not a record this package wrote; left alone
		}
		out = append(out, Current{Record: r, Exists: true, ResourceVersion: cm.ResourceVersion})
	}
	return out, nil
}
