package configmapcache

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func configMap(name, label string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{label: "true"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "test"}}},
		Data: data,
	}
}

func TestCache(t *testing.T) {
	client := fake.NewClientset(
		configMap("a", "mine", map[string]string{"k": "1", "drop": "x"}),
		configMap("b", "mine", map[string]string{"k": "2"}),
		configMap("c", "other", map[string]string{"k": "1"}),
	)
	c := New(client, "ns", "mine", "test records",
		func(cm *corev1.ConfigMap) { delete(cm.Data, "drop") },
		cache.Indexers{"k": func(obj any) ([]string, error) { return []string{obj.(*corev1.ConfigMap).Data["k"]}, nil }})

	_, _, err := c.Get("a")
	if !errors.Is(err, errNotSynced) || err.Error() != "the cache of test records has not synced yet" {
		t.Fatalf("Get before sync: %v, want ErrNotSynced naming the records", err)
	}
	if _, err := c.List(); !errors.Is(err, errNotSynced) {
		t.Fatalf("List before sync: %v, want ErrNotSynced", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	changed := make(chan string, 10)
	remove, err := c.OnChange(func(cm *corev1.ConfigMap) { changed <- cm.Name })
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	c.Start(ctx)
	if err := c.WaitForCacheSync(ctx); err != nil {
		t.Fatal(err)
	}

	cm, ok, err := c.Get("a")
	if err != nil || !ok {
		t.Fatalf("Get(a) = %v, %v", ok, err)
	}
	if cm.ManagedFields != nil || cm.Data["drop"] != "" || cm.Data["k"] != "1" {
		t.Errorf("cached a = %+v, want managed fields and trimmed data gone", cm)
	}
	if _, ok, err := c.Get("c"); ok || err != nil {
		t.Errorf("Get(c) of another label = %v, %v; want not found", ok, err)
	}
	all, err := c.List()
	if err != nil || len(all) != 2 {
		t.Errorf("List = %d ConfigMaps, %v; want 2", len(all), err)
	}
	byIndex, err := c.ByIndex("k", "2")
	if err != nil || len(byIndex) != 1 || byIndex[0].Name != "b" {
		t.Errorf("ByIndex(k, 2) = %v, %v; want b", byIndex, err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		select {
		case name := <-changed:
			seen[name] = true
		case <-ctx.Done():
			t.Fatalf("OnChange saw %v, want a and b", seen)
		}
	}
	if seen["c"] {
		t.Error("OnChange reported a ConfigMap of another label")
	}
}
