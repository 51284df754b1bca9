package nodebinding

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// clock is a settable clock for adoptions that lapse.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// nodeBeforeCreate wraps a transport: before the first ConfigMap creation
// it sends, it registers Node node with client, as a kubelet joining with
// an administrator's token would at that moment.
type nodeBeforeCreate struct {
	rt     http.RoundTripper
	client kubernetes.Interface
	node   string
	once   sync.Once
	err    error
}

func (n *nodeBeforeCreate) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/configmaps") {
		n.once.Do(func() {
			_, n.err = n.client.CoreV1().Nodes().Create(req.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.node}}, metav1.CreateOptions{})
		})
	}
	return n.rt.RoundTrip(req)
}

// TestClaimAndAdopt runs Claim and Adopt on a real API server: a name a
// Node holds without a binding is refused with nothing written, and bound
// once an administrator adopted it, by the identity the adoption names,
// before it lapses; a bound name cannot be adopted; a Node registered
// between Claim's check and its bind makes it release the binding; Bind,
// the first control plane's, binds its own Node's name.
func TestClaimAndAdopt(t *testing.T) {
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
	clk := &clock{now: time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)}
	store := New(client, ns, clk.Now)
	cms := client.CoreV1().ConfigMaps(ns)
	legacyNode := func(t *testing.T, name string) {
		t.Helper()
		if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	noBinding := func(t *testing.T, node string) {
		t.Helper()
		if cm, err := cms.Get(ctx, Name(node), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("binding ConfigMap of %s: %v, %v; want none", node, cm.Data, err)
		}
	}
	bound := func(t *testing.T, node, want string) {
		t.Helper()
		got, err := store.Identity(ctx, node)
		if want == "" && !errors.Is(err, ErrNotBound) {
			t.Fatalf("%s bound to %q (%v), want ErrNotBound", node, got, err)
		}
		if want != "" && (err != nil || got != want) {
			t.Fatalf("%s bound to %q (%v), want %q", node, got, err, want)
		}
	}
	adoption := func(by, identity string) Adoption {
		return Adoption{By: by, At: clk.Now(), Until: clk.Now().Add(time.Hour), Identity: identity}
	}

	t.Run("a name a Node holds without a binding is refused, nothing written", func(t *testing.T) {
		legacyNode(t, "legacy-1")
		_, err := store.Claim(ctx, "legacy-1", "id-attacker")
		if !errors.Is(err, ErrNameHeld) || !strings.Contains(err.Error(), "gatehouse node adopt legacy-1") {
			t.Fatalf("claiming legacy-1: %v, want ErrNameHeld telling to run gatehouse node adopt legacy-1", err)
		}
		noBinding(t, "legacy-1")
	})

	t.Run("a new name is bound; its Node, registered later, does not change that", func(t *testing.T) {
		if _, err := store.Claim(ctx, "new-1", "id-new"); err != nil {
			t.Fatal(err)
		}
		legacyNode(t, "new-1")
		if b, err := store.Claim(ctx, "new-1", "id-new"); err != nil || b != (Binding{}) {
			t.Fatalf("the bound machine asking again once its Node exists: %+v, %v", b, err)
		}
		if _, err := store.Claim(ctx, "new-1", "id-other"); !errors.Is(err, ErrNameBound) {
			t.Fatalf("another identity: %v, want ErrNameBound", err)
		}
		bound(t, "new-1", "id-new")
	})

	t.Run("an adopted name is bound by the next machine, once, with the adoption", func(t *testing.T) {
		prev, err := store.Adopt(ctx, "legacy-1", adoption("alice", ""))
		if err != nil || prev != nil {
			t.Fatalf("adopting legacy-1: %v, %v", prev, err)
		}
		bound(t, "legacy-1", "") // adopted is not bound
		b, err := store.Claim(ctx, "legacy-1", "id-machine")
		if err != nil || b.Adoption == nil || b.Adoption.By != "alice" || !b.Adoption.At.Equal(clk.Now()) {
			t.Fatalf("claiming the adopted name: %+v, %v; want a binding with alice's adoption", b, err)
		}
		bound(t, "legacy-1", "id-machine")
		cm, err := cms.Get(ctx, Name("legacy-1"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cm.Annotations[AnnotationAdoptedBy] != "alice" || cm.Annotations[AnnotationAdoptedUntil] != "" {
			t.Errorf("annotations of the bound adopted name: %v; want adopted-by kept and adopted-until gone", cm.Annotations)
		}
		if _, err := store.Claim(ctx, "legacy-1", "id-attacker"); !errors.Is(err, ErrNameBound) {
			t.Fatalf("another identity after the adoption was used: %v, want ErrNameBound", err)
		}
	})

	t.Run("adopting a bound name is refused and says how to rebind", func(t *testing.T) {
		_, err := store.Adopt(ctx, "legacy-1", adoption("mallory", ""))
		if !errors.Is(err, ErrNameBound) || !strings.Contains(err.Error(), AnnotationAllowIdentity) {
			t.Fatalf("adopting a bound name: %v, want ErrNameBound naming %s", err, AnnotationAllowIdentity)
		}
		bound(t, "legacy-1", "id-machine")
	})

	t.Run("an adoption for one identity refuses another", func(t *testing.T) {
		legacyNode(t, "legacy-2")
		if _, err := store.Adopt(ctx, "legacy-2", adoption("alice", "id-right")); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Claim(ctx, "legacy-2", "id-attacker"); !errors.Is(err, ErrNameHeld) || !strings.Contains(err.Error(), "id-right only") {
			t.Fatalf("another identity: %v, want ErrNameHeld naming the adopted identity", err)
		}
		bound(t, "legacy-2", "")
		if _, err := store.Claim(ctx, "legacy-2", "id-right"); err != nil {
			t.Fatal(err)
		}
		bound(t, "legacy-2", "id-right")
	})

	t.Run("an adoption lapses unused; adopting again replaces it", func(t *testing.T) {
		legacyNode(t, "legacy-3")
		if _, err := store.Adopt(ctx, "legacy-3", adoption("alice", "")); err != nil {
			t.Fatal(err)
		}
		clk.Add(time.Hour)
		if _, err := store.Claim(ctx, "legacy-3", "id-late"); !errors.Is(err, ErrNameHeld) || !strings.Contains(err.Error(), "lapsed") {
			t.Fatalf("claiming after the adoption lapsed: %v, want ErrNameHeld saying it lapsed", err)
		}
		bound(t, "legacy-3", "")
		prev, err := store.Adopt(ctx, "legacy-3", adoption("bob", ""))
		if err != nil || prev == nil || prev.By != "alice" {
			t.Fatalf("adopting again: previous %+v, %v; want alice's", prev, err)
		}
		if b, err := store.Claim(ctx, "legacy-3", "id-late"); err != nil || b.Adoption == nil || b.Adoption.By != "bob" {
			t.Fatalf("claiming under the new adoption: %+v, %v", b, err)
		}
	})

	t.Run("a Node registered between the check and the bind releases the binding", func(t *testing.T) {
		cfg := rest.CopyConfig(env.Config)
		hook := &nodeBeforeCreate{client: client, node: "racy-1"}
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { hook.rt = rt; return hook })
		racy, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(racy, ns, clk.Now).Claim(ctx, "racy-1", "id-attacker")
		if hook.err != nil {
			t.Fatalf("registering the Node in the window: %v", hook.err)
		}
		if !errors.Is(err, ErrNameHeld) {
			t.Fatalf("claiming while the Node registers: %v, want ErrNameHeld", err)
		}
		bound(t, "racy-1", "")
		// The released ConfigMap binds nothing: the name is still held, an
		// adoption admits a machine, and without its Node it is free.
		if _, err := store.Claim(ctx, "racy-1", "id-attacker"); !errors.Is(err, ErrNameHeld) {
			t.Fatalf("claiming the released name again: %v, want ErrNameHeld", err)
		}
		if err := client.CoreV1().Nodes().Delete(ctx, "racy-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Claim(ctx, "racy-1", "id-new"); err != nil {
			t.Fatalf("claiming the released name once its Node is gone: %v", err)
		}
		bound(t, "racy-1", "id-new")
	})

	t.Run("the first control plane binds its own Node's name", func(t *testing.T) {
		legacyNode(t, "cp-0")
		if _, err := store.Bind(ctx, "cp-0", "id-cp"); err != nil {
			t.Fatal(err)
		}
		bound(t, "cp-0", "id-cp")
		if _, err := store.Claim(ctx, "cp-0", "id-cp"); err != nil {
			t.Fatalf("the control plane asking the join service again: %v", err)
		}
	})

	t.Run("bad adoptions are refused", func(t *testing.T) {
		for _, tc := range []struct {
			name, node string
			a          Adoption
		}{
			{"no node name", "", adoption("alice", "")},
			{"a name that is no node name", "Legacy_4", adoption("alice", "")},
			{"nobody adopted it", "legacy-4", adoption("", "")},
			{"it ends when it starts", "legacy-4", Adoption{By: "alice", At: clk.Now(), Until: clk.Now()}},
		} {
			if _, err := store.Adopt(ctx, tc.node, tc.a); err == nil {
				t.Errorf("%s: adopted", tc.name)
			}
		}
		noBinding(t, "legacy-4")
	})

	// The cache, as continuous attestation reads it, agrees: an adopted
	// name is bound to no identity.
	if _, err := store.Adopt(ctx, "legacy-5", adoption("alice", "")); err != nil {
		t.Fatal(err)
	}
	c := NewCache(client, ns)
	c.Start(ctx)
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitForCacheSync(syncCtx); err != nil {
		t.Fatal(err)
	}
	if id, err := c.Identity(ctx, "legacy-5"); !errors.Is(err, ErrNotBound) {
		t.Errorf("the cache binds the adopted legacy-5 to %q (%v), want ErrNotBound", id, err)
	}
	if id, err := c.Identity(ctx, "legacy-1"); err != nil || id != "id-machine" {
		t.Errorf("the cache binds legacy-1 to %q (%v), want id-machine", id, err)
	}
}
