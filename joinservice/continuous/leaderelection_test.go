package continuous

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestLeaderGauge runs two replicas' elections through a real API
// server's Lease: gatehouse_reattest_leader is 1 on exactly one, and
// moves to the other when the leader stops (its Lease released).
func TestLeaderGauge(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	type replica struct {
		gauge  prometheus.Gauge
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(identity string) *replica {
		g, err := NewLeaderGauge(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		r := &replica{gauge: g, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(r.done)
			RunElected(ctx, client, namespace, identity, log, g, nil, nil)
		}()
		t.Cleanup(func() { cancel(); <-r.done })
		return r
	}
	a, b := start("replica-a"), start("replica-b")
	var leader, follower *replica
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		ga, gb := testutil.ToFloat64(a.gauge), testutil.ToFloat64(b.gauge)
		switch {
		case ga == 1 && gb == 0:
			leader, follower = a, b
		case gb == 1 && ga == 0:
			leader, follower = b, a
		}
		return leader != nil, nil
	})
	if err != nil {
		t.Fatalf("no single leader: gauges %v and %v", testutil.ToFloat64(a.gauge), testutil.ToFloat64(b.gauge))
	}
	leader.cancel()
	<-leader.done
	if got := testutil.ToFloat64(leader.gauge); got != 0 {
		t.Errorf("the stopped replica's gauge is %v, want 0", got)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return testutil.ToFloat64(follower.gauge) == 1, nil
	})
	if err != nil {
		t.Errorf("the other replica did not take the Lease over: gauge %v", testutil.ToFloat64(follower.gauge))
	}
	// Registering twice in one registry is refused.
	reg := prometheus.NewRegistry()
	if _, err := NewLeaderGauge(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLeaderGauge(reg); err == nil {
		t.Error("a second leader gauge in one registry was accepted")
	}
}
