package testenv

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestNewEnvtestInstallsCRDs(t *testing.T) {
	cfg := NewEnvtest(t, "testdata/crds")
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	widget := &unstructured.Unstructured{}
	widget.SetGroupVersionKind(schema.GroupVersionKind{Group: "testenv.gatehouse.dev", Version: "v1", Kind: "Widget"})
	widget.SetNamespace("default")
	widget.SetName("w1")
	if err := unstructured.SetNestedField(widget.Object, int64(3), "spec", "size"); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), widget); err != nil {
		t.Fatalf("creating a custom resource of the installed CRD: %v", err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(widget.GroupVersionKind())
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(widget), got); err != nil {
		t.Fatal(err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 3 {
		t.Errorf("spec.size = %d, want 3", size)
	}
}
