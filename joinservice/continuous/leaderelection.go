package continuous

import (
	"context"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// leaseName is the Lease the join service's replicas elect the one that
// runs the loop with.
const leaseName = "gatehouse-reattest"

// RunElected runs l and approve (either may be nil; approve is the
// certificate approver's Run, csrapprover.Approver.Run) in the replica
// elected through the Lease leaseName in namespace (identity names this
// replica, e.g. its pod), until ctx ends: one loop and one approver per
// cluster, taken over within about 15 s when its replica stops.
func RunElected(ctx context.Context, client kubernetes.Interface, namespace, identity string, log *slog.Logger, l *Loop, approve func(context.Context) error) {
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
			OnStoppedLeading: func() { log.Info("No longer leading continuous attestation", "identity", identity) },
		},
	})
}
