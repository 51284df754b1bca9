package nodeattestation

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/configmapcache"
)

// Cache reads the records from an informer's cache of the record
// ConfigMaps (those labelled Label in the namespace): every credential
// decision reads a record, and a GET each would cost the API server a
// request per decision. The watch keeps it current within moments of a
// write. Start it, and WaitForCacheSync, before use. It is safe for
// concurrent use.
type Cache struct {
	cms *configmapcache.Cache
}

// NewCache returns the cache of the records kept in namespace.
func NewCache(client kubernetes.Interface, namespace string) *Cache {
	return &Cache{cms: configmapcache.New(client, namespace, Label, "attestation records", nil, nil)}
}

// Start starts the informer; it stops when ctx ends.
func (c *Cache) Start(ctx context.Context) { c.cms.Start(ctx) }

// WaitForCacheSync waits until the cache holds every record that existed
// when it started, or ctx ends.
func (c *Cache) WaitForCacheSync(ctx context.Context) error { return c.cms.WaitForCacheSync(ctx) }

// OnChange calls f with the node name of every record added, changed or
// deleted (for example to mirror it onto the Node at once), until remove
// is called.
func (c *Cache) OnChange(f func(node string)) (remove func(), err error) {
	return c.cms.OnChange(func(cm *corev1.ConfigMap) {
		if cm.Data[keyNode] != "" {
			f(cm.Data[keyNode])
		}
	})
}

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
	cm, ok, err := c.cms.Get(recordName(node))
	if err != nil {
		return Current{}, fmt.Errorf("reading the attestation record of node %s: %w", node, err)
	}
	if !ok {
		return Current{}, nil
	}
	r, err := fromConfigMap(cm, node)
	if err != nil {
		return Current{}, err
	}
	return Current{Record: r, Exists: true, ResourceVersion: cm.ResourceVersion}, nil
}

// List returns every cached record, each with its resourceVersion.
func (c *Cache) List() ([]Current, error) {
	cms, err := c.cms.List()
	if err != nil {
		return nil, fmt.Errorf("listing the attestation records: %w", err)
	}
	var out []Current
	for _, cm := range cms {
		r, err := fromConfigMap(cm, "")
		if err != nil {
			continue // not a record this package wrote; left alone
		}
		out = append(out, Current{Record: r, Exists: true, ResourceVersion: cm.ResourceVersion})
	}
	return out, nil
}
