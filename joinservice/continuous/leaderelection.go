package continuous

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// leaseName is the Lease the join service's replicas elect the one that
// runs the loop with.
const leaseName = "gatehouse-reattest"

// NewLeaderGauge registers with reg and returns
// gatehouse_reattest_leader, the gauge RunElected sets to 1 while this
// replica holds the Lease leaseName and to 0 otherwise: summed over the
// replicas it is 1 in a healthy cluster (docs/operations.md,
// "GatehouseReattestNoLeader"). It errors when reg refuses it.
func NewLeaderGauge(reg prometheus.Registerer) (prometheus.Gauge, error) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "gatehouse", Subsystem: "reattest", Name: "leader",
		Help: "1 while this replica holds the continuous attestation Lease (gatehouse-reattest) and runs the loop and the certificate approver, 0 otherwise.",
	})
	if err := reg.Register(g); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	return g, nil
}

// RunElected runs l and approve (either may be nil; approve is the
// certificate approver's Run, csrapprover.Approver.Run) in the replica
// elected through the Lease leaseName in namespace (identity names this
// replica, e.g. its pod), until ctx ends: one loop and one approver per
// cluster, taken over within about 15 s when its replica stops. leader
// (NewLeaderGauge) is 1 while this replica leads.
func RunElected(ctx context.Context, client kubernetes.Interface, namespace, identity string, log *slog.Logger, leader prometheus.Gauge, l *Loop, approve func(context.Context) error) {
	leader.Set(0)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: leaseName, Namespace: namespace},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		ReleaseOnCancel: true, Name: leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				leader.Set(1)
				log.Info("Leading continuous attestation", "identity", identity, "loop", l != nil, "approver", approve != nil)
				g, ctx := errgroup.WithContext(ctx)
				if l != nil {
					g.Go(func() error { return l.Run(ctx) })
				}
				if approve != nil {
					g.Go(func() error { return approve(ctx) })
				}
				if err := g.Wait(); err != nil && ctx.Err() == nil {
					log.Error("Continuous attestation stopped", "error", err.Error())
				}
			},
			OnStoppedLeading: func() {
				leader.Set(0)
				log.Info("No longer leading continuous attestation", "identity", identity)
			},
		},
	})
}
