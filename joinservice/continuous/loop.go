package continuous

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// checker verifies one node and tells what to do about failures
// (*Verifier).
type checker interface {
	Check(ctx context.Context, node *corev1.Node) (Outcome, error)
	Settings() (joinconfig.ContinuousAttestation, error)
}

// nodeLister lists the Nodes a round checks (*NodeCache). The Nodes are
// the cache's: the loop only reads them.
type nodeLister interface {
	List() ([]*corev1.Node, error)
}

// LoopConfig configures a Loop.
type LoopConfig struct {
	// Client writes the Nodes' conditions and taints, and Events.
	Client kubernetes.Interface
	// Nodes lists the Nodes each round checks, from an informer's cache
	// (NewNodeCache, started and synced): a round makes no API request
	// unless an outcome changed. A Node whose cached copy lags behind the
	// loop's own last write is at worst written again.
	Nodes    nodeLister
	Verifier checker
	// Events records an Event on the Node at each change of outcome
	// (NewEventRecorder).
	Events events.EventRecorder
	// Interval between rounds (each ±10 %); DefaultInterval when zero.
	Interval time.Duration
	// Heartbeat is how often an unchanged condition's lastHeartbeatTime
	// is refreshed: the Node is written only when the outcome changes, or
	// when its last write is older than this (DefaultHeartbeat when zero).
	Heartbeat time.Duration
	// Concurrency bounds the nodes checked at once (16 when zero).
	Concurrency int
	Now         func() time.Time
	Log         *slog.Logger
	Registerer  prometheus.Registerer
}

// Defaults of LoopConfig.
const (
	DefaultInterval  = time.Minute
	DefaultHeartbeat = 10 * time.Minute
)

// Loop re-verifies every Node on an interval and records the outcome on
// it. Run it in one process of the cluster (the join service's leader).
type Loop struct {
	cfg     LoopConfig
	metrics *metrics

	mu               sync.Mutex
	lastSuccess      map[string]time.Time // by node: the last time it verified
	unreachableSince map[string]time.Time // by node: since when it has not answered
}

// NewLoop returns the loop; its metrics are registered with cfg.Registerer.
func NewLoop(cfg LoopConfig) (*Loop, error) {
	if cfg.Client == nil || cfg.Nodes == nil || cfg.Verifier == nil || cfg.Events == nil || cfg.Log == nil || cfg.Registerer == nil {
		return nil, fmt.Errorf("continuous attestation: Client, Nodes, Verifier, Events, Log and Registerer are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Loop{cfg: cfg, metrics: m, lastSuccess: map[string]time.Time{}, unreachableSince: map[string]time.Time{}}, nil
}

// Run runs a round every interval (±10 %) until ctx ends. A round that
// cannot judge (no policy yet) is logged and retried next interval.
func (l *Loop) Run(ctx context.Context) error {
	for {
		if _, err := l.Round(ctx); err != nil && ctx.Err() == nil {
			l.cfg.Log.Warn("Continuous attestation round failed", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(jitter(l.cfg.Interval)):
		}
	}
}

// Round checks every Node once and records each outcome that changed,
// and returns the outcomes. It returns an error when it could not list
// the Nodes or judge at all (no policy).
func (l *Loop) Round(ctx context.Context) ([]Outcome, error) {
	start := l.cfg.Now()
	defer func() { l.metrics.roundSeconds.Observe(l.cfg.Now().Sub(start).Seconds()) }()
	nodes, err := l.cfg.Nodes.List()
	if err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	settings, err := l.cfg.Verifier.Settings()
	if err != nil {
		return nil, err
	}
	// First every verdict, then the writes and actions: whether a control
	// plane may be tainted depends on the others' verdicts.
	outcomes := make([]Outcome, len(nodes))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(l.cfg.Concurrency)
	for i := range nodes {
		g.Go(func() error {
			o, err := l.cfg.Verifier.Check(gctx, nodes[i])
			if err != nil {
				return err
			}
			outcomes[i] = o
			l.metrics.verifications.WithLabelValues(o.Reason).Inc()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	attestedControlPlanes := 0
	for i, n := range nodes {
		if _, cp := n.Labels[labelControlPlane]; cp && outcomes[i].Attested {
			attestedControlPlanes++
		}
	}
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(l.cfg.Concurrency)
	for i := range nodes {
		g.Go(func() error {
			node, err := l.record(gctx, nodes[i], outcomes[i])
			if err != nil {
				return err
			}
			// An action that fails (a Node changed under it) is tried
			// again next round; it does not stop the others.
			if err := l.act(gctx, node, outcomes[i], settings, attestedControlPlanes); err != nil {
				l.cfg.Log.Warn("Continuous attestation could not act on a Node; next round tries again", "node", node.Name, "error", err.Error())
			}
			return nil
		})
	}
	err = g.Wait()
	l.updateOldest(nodes)
	return outcomes, err
}

// TaintKey is the taint continuous attestation puts on a node that stopped
// proving itself, with the NoExecute effect: pods that do not tolerate it
// leave the node.
const TaintKey = "gatehouse.dev/unattested"

// act taints a failing node and untaints one that proves itself again, as
// settings say. An unreachable node is acted on only after the grace
// period. The last attested control planes are never tainted: when every
// control plane fails, acting would leave none, so the loop refuses and
// says so loudly.
func (l *Loop) act(ctx context.Context, node *corev1.Node, o Outcome, settings joinconfig.ContinuousAttestation, attestedControlPlanes int) error {
	now := l.cfg.Now()
	failing := !o.Attested
	l.mu.Lock()
	if o.Reason == ReasonUnreachable || o.Reason == ReasonRebooting {
		since, ok := l.unreachableSince[node.Name]
		if !ok {
			since = now
			l.unreachableSince[node.Name] = now
		}
		failing = now.Sub(since) >= settings.UnreachableGrace.Duration
	} else {
		delete(l.unreachableSince, node.Name)
	}
	l.mu.Unlock()
	tainted := hasTaint(node)
	switch {
	case failing && !tainted && settings.Action == joinconfig.ActionTaint:
		if _, cp := node.Labels[labelControlPlane]; cp && attestedControlPlanes == 0 {
			l.metrics.actions.WithLabelValues("taint_refused").Inc()
			l.cfg.Log.Error("Not tainting control plane "+node.Name+": no control plane is attested, and tainting would leave the cluster none; "+
				"check the policy and the control planes now", "event", "reattest.action", "node", node.Name, "action", "taint_refused", "reason", o.Reason)
			return nil
		}
		taints := append(slices.Clone(node.Spec.Taints), corev1.Taint{Key: TaintKey, Effect: corev1.TaintEffectNoExecute, TimeAdded: ptr.To(metav1.NewTime(now))})
		return l.setTaints(ctx, node, taints, "taint", o)
	case !failing && o.Attested && tainted && settings.Restore == joinconfig.RestoreAuto:
		taints := slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == TaintKey })
		return l.setTaints(ctx, node, taints, "untaint", o)
	}
	return nil
}

// setTaints replaces node's taints, if node is unchanged since it was read.
func (l *Loop) setTaints(ctx context.Context, node *corev1.Node, taints []corev1.Taint, action string, o Outcome) error {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": taints},
	})
	if err != nil {
		return err
	}
	if _, err := l.cfg.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("%s of Node %s: %w", action, node.Name, err)
	}
	l.metrics.actions.WithLabelValues(action).Inc()
	l.cfg.Log.Warn("audit", "event", "reattest.action", "node", node.Name, "action", action, "reason", o.Reason, "identity", o.Identity)
	kind := corev1.EventTypeWarning
	if action == "untaint" {
		kind = corev1.EventTypeNormal
	}
	l.cfg.Events.Eventf(node, nil, kind, action, "Reattest", "%s %s: %s", action, TaintKey, o.Reason)
	return nil
}

func hasTaint(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintKey })
}

// record writes o onto node when it differs from the node's condition, or
// when the condition's heartbeat is due; it logs failures and changes. It
// returns the Node as it now is.
func (l *Loop) record(ctx context.Context, node *corev1.Node, o Outcome) (*corev1.Node, error) {
	now := l.cfg.Now()
	if o.Attested {
		l.mu.Lock()
		l.lastSuccess[node.Name] = now
		l.mu.Unlock()
	}
	cond := o.condition(now)
	var old *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == ConditionType {
			old = &node.Status.Conditions[i]
		}
	}
	changed := old == nil || old.Status != cond.Status || old.Reason != cond.Reason || old.Message != cond.Message
	if !o.Attested || changed {
		logOutcome(l.cfg.Log, o, changed)
	}
	if changed {
		kind := corev1.EventTypeNormal
		if !o.Attested {
			kind = corev1.EventTypeWarning
		}
		l.cfg.Events.Eventf(node, nil, kind, o.Reason, "Reattest", "%s", truncate(o.Message, 512))
	}
	if !changed && now.Sub(old.LastHeartbeatTime.Time) < l.cfg.Heartbeat {
		return node, nil
	}
	if old != nil && old.Status == cond.Status {
		cond.LastTransitionTime = old.LastTransitionTime
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return nil, err
	}
	// A strategic merge patch: conditions merge by type, others stay.
	updated, err := l.cfg.Client.CoreV1().Nodes().PatchStatus(ctx, node.Name, patch)
	if err != nil {
		return nil, fmt.Errorf("recording the attestation of Node %s: %w", node.Name, err)
	}
	l.metrics.writes.Inc()
	return updated, nil
}

// updateOldest sets the age of the oldest last success among nodes (a
// node never verified counts from when it was created).
func (l *Loop) updateOldest(nodes []*corev1.Node) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	oldest := time.Duration(0)
	present := map[string]bool{}
	for _, n := range nodes {
		present[n.Name] = true
		last, ok := l.lastSuccess[n.Name]
		if !ok {
			last = n.CreationTimestamp.Time
		}
		oldest = max(oldest, now.Sub(last))
	}
	for name := range l.lastSuccess {
		if !present[name] {
			delete(l.lastSuccess, name)
		}
	}
	l.metrics.oldestSuccessAge.Set(oldest.Seconds())
}

type metrics struct {
	verifications    *prometheus.CounterVec
	actions          *prometheus.CounterVec
	writes           prometheus.Counter
	oldestSuccessAge prometheus.Gauge
	roundSeconds     prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "verifications_total",
			Help: "Re-verifications of running nodes, by result (the condition's reason).",
		}, []string{"result"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "actions_total",
			Help: "Actions on Nodes: taint, untaint, and taint_refused (the last attested control planes are never tainted).",
		}, []string{"action"}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "node_status_writes_total",
			Help: "Node status writes (on a change of outcome, or a due heartbeat).",
		}),
		oldestSuccessAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "oldest_success_age_seconds",
			Help: "Age of the oldest last successful verification among the Nodes.",
		}),
		roundSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "round_duration_seconds",
			Help: "Duration of one round over every Node.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
	}
	for _, c := range []prometheus.Collector{m.verifications, m.actions, m.writes, m.oldestSuccessAge, m.roundSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
}

// NewEventRecorder returns the recorder of Node Events (events.k8s.io),
// sending until ctx ends.
func NewEventRecorder(ctx context.Context, client kubernetes.Interface) events.EventRecorder {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	return b.NewRecorder(scheme.Scheme, "gatehouse-joinservice")
}

// LeaseName is the Lease the join service's replicas elect the one that
// runs the loop with.
const LeaseName = "gatehouse-reattest"

// RunElected runs l and a (either may be nil) in the replica elected
// through the Lease LeaseName in namespace (identity names this replica,
// e.g. its pod), until ctx ends: one loop and one approver per cluster,
// taken over within about 15 s when its replica stops.
func RunElected(ctx context.Context, client kubernetes.Interface, namespace, identity string, log *slog.Logger, l *Loop, a *Approver) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: namespace},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		ReleaseOnCancel: true, Name: LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("Leading continuous attestation", "identity", identity, "loop", l != nil, "approver", a != nil)
				g, ctx := errgroup.WithContext(ctx)
				if l != nil {
					g.Go(func() error { return l.Run(ctx) })
				}
				if a != nil {
					g.Go(func() error { return a.Run(ctx) })
				}
				if err := g.Wait(); err != nil && ctx.Err() == nil {
					log.Error("Continuous attestation stopped", "error", err.Error())
				}
			},
			OnStoppedLeading: func() { log.Info("No longer leading continuous attestation", "identity", identity) },
		},
	})
}

// dataKeySource gives data keys (*joinservice.KeyServiceKeys).
type dataKeySource interface {
	GetDataKey(ctx context.Context, id string, length int) ([]byte, error)
}

// ClusterID returns the function that derives the cluster ID (the value
// running nodes extend into the node-lock PCR): from the key service's
// measurement secret and the join config's measurement salt.
func ClusterID(keySource dataKeySource, p policySource) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		join, _, err := p.Current()
		if err != nil {
			return nil, err
		}
		secret, err := keySource.GetDataKey(ctx, keys.MeasurementSecretID, keys.MeasurementSecretSize)
		if err != nil {
			return nil, fmt.Errorf("getting the measurement secret: %w", err)
		}
		return keys.DeriveClusterID(secret, join.MeasurementSalt)
	}
}
