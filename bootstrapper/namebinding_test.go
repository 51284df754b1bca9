package bootstrapper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestBindNodeName: on a real API server (as kubeadm init leaves it: no
// Gatehouse namespace yet), the first control plane binds its name to its
// identity; binding again is a no-op; another machine claiming the name
// is refused at once, and the binding stays.
func TestBindNodeName(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	ctx := t.Context()
	if err := BindNodeName(ctx, env.KubeconfigPath, "cp-0", "tpm-ak:sha256:first"); err != nil {
		t.Fatal(err)
	}
	if err := BindNodeName(ctx, env.KubeconfigPath, "cp-0", "tpm-ak:sha256:first"); err != nil {
		t.Fatalf("binding the same identity again: %v", err)
	}
	err := BindNodeName(ctx, env.KubeconfigPath, "cp-0", "tpm-ak:sha256:other")
	if !errors.Is(err, nodebinding.ErrNameBound) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("another identity claiming the name: %v, want ErrNameBound without retrying until the deadline", err)
	}
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	got, err := nodebinding.New(client, charts.Namespace, time.Now).Identity(ctx, "cp-0")
	if err != nil || got != "tpm-ak:sha256:first" {
		t.Fatalf("the binding of cp-0: %q, %v", got, err)
	}
}
