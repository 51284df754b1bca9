package nodebinding

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestCache binds names on a real API server and reads them through the
// cache as through the Store: the same identities, ErrNotBound for a name
// nobody holds or a binding that names another node, and nothing from a
// ConfigMap without the binding label; binds, rebinds and removals made
// after the sync show within moments.
func TestCache(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const ns = "gatehouse-system"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	store := New(client, ns, time.Now)
	if _, err := store.Bind(ctx, "worker-1", "id-1"); err != nil {
		t.Fatal(err)
	}
	cms := client.CoreV1().ConfigMaps(ns)
	// A binding ConfigMap that names another node than its name's.
	if _, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: Name("worker-moved"), Labels: map[string]string{Label: "true"}},
		Data:       map[string]string{KeyNode: "worker-other", KeyIdentity: "id-x"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	c := NewCache(client, ns)
	if _, err := c.Identity(ctx, "worker-1"); err == nil || errors.Is(err, ErrNotBound) {
		t.Fatalf("before its sync the cache answered %v; want an error that is not ErrNotBound", err)
	}
	c.Start(ctx)
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitForCacheSync(syncCtx); err != nil {
		t.Fatal(err)
	}

	// same checks that the cache answers as the Store does.
	same := func(node, wantID string) {
		t.Helper()
		for name, src := range map[string]interface {
			Identity(context.Context, string) (string, error)
		}{"store": store, "cache": c} {
			id, err := src.Identity(ctx, node)
			switch {
			case wantID == "" && !errors.Is(err, ErrNotBound):
				t.Errorf("%s: %s bound to %q (%v), want ErrNotBound", name, node, id, err)
			case wantID != "" && (err != nil || id != wantID):
				t.Errorf("%s: %s bound to %q (%v), want %q", name, node, id, err, wantID)
			}
		}
	}
	same("worker-1", "id-1")
	same("worker-unknown", "")
	same("worker-moved", "")

	// eventually polls until the cache gives node wantID ("": not bound).
	eventually := func(node, wantID string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			id, err := c.Identity(ctx, node)
			if wantID == "" {
				return errors.Is(err, ErrNotBound), nil
			}
			return err == nil && id == wantID, nil
		})
		if err != nil {
			t.Fatalf("the cache does not give %s identity %q: %v", node, wantID, err)
		}
	}
	// A ConfigMap named as a binding but without the label is not one.
	if _, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: Name("worker-unlabelled")},
		Data:       map[string]string{KeyNode: "worker-unlabelled", KeyIdentity: "id-u"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A bind after the sync shows; the watch delivers in order, so the
	// unlabelled ConfigMap, created before it, would have shown by then.
	if _, err := store.Bind(ctx, "worker-2", "id-2"); err != nil {
		t.Fatal(err)
	}
	eventually("worker-2", "id-2")
	if id, err := c.Identity(ctx, "worker-unlabelled"); !errors.Is(err, ErrNotBound) {
		t.Errorf("an unlabelled ConfigMap binds worker-unlabelled to %q (%v)", id, err)
	}

	// An administrator lets a reinstalled machine take worker-2 over.
	cm, err := cms.Get(ctx, Name("worker-2"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Annotations = map[string]string{AnnotationAllowIdentity: "id-2b"}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := store.Bind(ctx, "worker-2", "id-2b"); err != nil || !b.Rebound {
		t.Fatalf("rebinding: %+v, %v", b, err)
	}
	eventually("worker-2", "id-2b")

	// An administrator frees the name.
	if err := cms.Delete(ctx, Name("worker-1"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("worker-1", "")
	same("worker-1", "")
}
