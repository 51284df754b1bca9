package bootstrapper

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestBindNodeName: on a real API server (as kubeadm init leaves it: no
// Gatehouse namespace yet, and the node's own Node registered, so its name
// is held without a binding), the first control plane binds its name to
// its identity; binding again is a no-op; another machine claiming the
// name is refused at once, and the binding stays.
func TestBindNodeName(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	ctx := t.Context()
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-0"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := BindNodeName(ctx, env.KubeconfigPath, "cp-0", "tpm-ak:sha256:first"); err != nil {
		t.Fatal(err)
	}
	if err := BindNodeName(ctx, env.KubeconfigPath, "cp-0", "tpm-ak:sha256:first"); err != nil {
		t.Fatalf("binding the same identity again: %v", err)
	}
	err = BindNodeName(ctx, env.KubeconfigPath, "cp-0", "tpm-ak:sha256:other")
	if !errors.Is(err, nodebinding.ErrNameBound) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("another identity claiming the name: %v, want ErrNameBound without retrying until the deadline", err)
	}
	got, err := nodebinding.New(client, charts.Namespace, time.Now).Identity(ctx, "cp-0")
	if err != nil || got != "tpm-ak:sha256:first" {
		t.Fatalf("the binding of cp-0: %q, %v", got, err)
	}
}
