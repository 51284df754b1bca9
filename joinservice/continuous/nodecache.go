package continuous

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// NodeCache lists the Nodes from an informer's cache: a round reads every
// Node without a List from the API server (at 10,000 Nodes a minute, that
// List alone would be the largest request the loop makes), and the watch
// keeps the cache current. The cached Nodes keep what the loop reads: no
// managed fields and no image list. Start it, and WaitForCacheSync, before
// use.
type NodeCache struct {
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   corelisters.NodeLister
}

// NewNodeCache returns the cache of client's Nodes.
func NewNodeCache(client kubernetes.Interface) *NodeCache {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trimNode))
	nodes := factory.Core().V1().Nodes()
	return &NodeCache{factory: factory, informer: nodes.Informer(), lister: nodes.Lister()}
}

// trimNode drops what the loop never reads from a cached Node.
func trimNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
	}
	return obj, nil
}

// Start starts the informer; it stops when ctx ends.
func (c *NodeCache) Start(ctx context.Context) { c.factory.Start(ctx.Done()) }

// WaitForCacheSync waits until the cache holds every Node, or ctx ends.
func (c *NodeCache) WaitForCacheSync(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("waiting for the Nodes: %w", context.Cause(ctx))
	}
	return nil
}

// Get returns the cached Node name. It is the cache's: read it, never
// change it.
func (c *NodeCache) Get(name string) (*corev1.Node, error) {
	if !c.informer.HasSynced() {
		return nil, errors.New("the cache of Nodes has not synced yet")
	}
	return c.lister.Get(name)
}

// OnChange calls f with the name of every Node added or changed, until
// remove is called.
func (c *NodeCache) OnChange(f func(name string)) (remove func(), err error) {
	call := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			f(n.Name)
		}
	}
	reg, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: call, UpdateFunc: func(_, obj any) { call(obj) }})
	if err != nil {
		return nil, err
	}
	return func() { _ = c.informer.RemoveEventHandler(reg) }, nil
}

// List returns every cached Node. The Nodes are the cache's: read them,
// never change them.
func (c *NodeCache) List() ([]*corev1.Node, error) {
	if !c.informer.HasSynced() {
		return nil, errors.New("the cache of Nodes has not synced yet")
	}
	return c.lister.List(labels.Everything())
}
