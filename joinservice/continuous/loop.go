package continuous

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// checker verifies one node and tells what to do about failures
// (*NodeChecker).
type checker interface {
	Check(ctx context.Context, node *corev1.Node) (Outcome, error)
	Settings() (joinconfig.ContinuousAttestation, error)
}

// nodeLister lists and gets the Nodes the loop checks and mirrors its
// verdicts onto (*NodeCache). The Nodes are the cache's: the loop only
// reads them.
type nodeLister interface {
	List() ([]*corev1.Node, error)
	Get(name string) (*corev1.Node, error)
	OnChange(f func(name string)) (remove func(), err error)
}

// recordCache reads the authoritative records (*nodeattestation.Cache).
type recordCache interface {
	Current(node string) (nodeattestation.Current, error)
	List() ([]nodeattestation.Current, error)
	OnChange(f func(node string)) (remove func(), err error)
}

// recordWriter writes the authoritative records (*nodeattestation.Store).
type recordWriter interface {
	Update(ctx context.Context, node string, cur *nodeattestation.Current,
		change func(old nodeattestation.Record, exists bool) (nodeattestation.Record, bool)) (nodeattestation.Record, error)
	Delete(ctx context.Context, node, resourceVersion string) error
}

// LoopConfig configures a Loop.
type LoopConfig struct {
	// Client writes the Nodes' conditions and taints (the mirrors of the
	// records), and Events.
	Client kubernetes.Interface
	// Nodes lists the Nodes each round checks, from an informer's cache
	// (NewNodeCache, started and synced): a round makes no API request
	// unless an outcome changed.
	Nodes nodeLister
	// Records and RecordCache write and read the authoritative
	// attestation records (nodeattestation.NewStore, NewCache started and
	// synced).
	Records     recordWriter
	RecordCache recordCache
	Checker     checker
	// Events records an Event on the Node at each change of outcome
	// (NewEventRecorder).
	Events events.EventRecorder
	// Interval between rounds (each ±10 %); DefaultInterval when zero.
	Interval time.Duration
	// Heartbeat is how often an unchanged record's checkedAt is
	// refreshed: a record is written only when the outcome changes, or
	// when its last write is older than this (defaultHeartbeat when zero).
	Heartbeat time.Duration
	// FetchTimeout bounds one node's check (DefaultFetchTimeout when
	// zero): a node that does not answer in time is Unreachable, and
	// delays no other node's verdict.
	FetchTimeout time.Duration
	// Concurrency bounds the nodes checked at once (16 when zero).
	Concurrency int
	Now         func() time.Time
	Log         *slog.Logger
	Registerer  prometheus.Registerer
}

// Defaults of LoopConfig.
const (
	DefaultInterval     = time.Minute
	defaultHeartbeat    = 10 * time.Minute
	DefaultFetchTimeout = 5 * time.Second
)

// Loop re-verifies every Node on an interval, records each verdict in the
// node's authoritative record as it arrives, and mirrors the record onto
// the Node (condition and taint), re-asserting the mirror whenever anyone
// else changes it. Run it in one process of the cluster (the join
// service's leader).
type Loop struct {
	cfg     LoopConfig
	metrics *metrics

	mu          sync.Mutex
	lastSuccess map[string]time.Time // by node: the last time it verified
	unreachable map[string]bool      // by node: it did not answer at its last check
	// controlPlanes holds, by control-plane node, whether it is attested
	// as the records and this round's verdicts say: one is never tainted
	// while none other is attested.
	controlPlanes map[string]bool
	// status holds, by node, the reason its gatehouse_reattest_node_status
	// series carries.
	status map[string]string
}

// NewLoop returns the loop; its metrics are registered with cfg.Registerer.
func NewLoop(cfg LoopConfig) (*Loop, error) {
	if cfg.Client == nil || cfg.Nodes == nil || cfg.Records == nil || cfg.RecordCache == nil || cfg.Checker == nil ||
		cfg.Events == nil || cfg.Log == nil || cfg.Registerer == nil {
		return nil, fmt.Errorf("continuous attestation: Client, Nodes, Records, RecordCache, Verifier, Events, Log and Registerer are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = defaultHeartbeat
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = DefaultFetchTimeout
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
	return &Loop{cfg: cfg, metrics: m, lastSuccess: map[string]time.Time{}, unreachable: map[string]bool{}, controlPlanes: map[string]bool{}, status: map[string]string{}}, nil
}

// Run mirrors the records onto the Nodes as they or the Nodes change, and
// runs a round every interval (±10 %), until ctx ends. A round that
// cannot judge (no policy yet) is logged and retried next interval. When
// it returns (leadership lost), the per-node status series are deleted and
// the oldest success age is 0: only the leader speaks for the nodes.
func (l *Loop) Run(ctx context.Context) error {
	defer l.forgetStatus()
	stop, err := l.startMirror(ctx)
	if err != nil {
		return err
	}
	defer stop()
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

// Round checks every Node once and returns the outcomes. Each node's
// verdict is recorded, and mirrored onto its Node, as soon as its check
// ends: no node waits for another, and a node that does not answer delays
// the others by nothing (its own check ends after FetchTimeout). It
// returns an error when it could not list the Nodes or judge at all (no
// policy).
func (l *Loop) Round(ctx context.Context) ([]Outcome, error) {
	start := l.cfg.Now()
	defer func() { l.metrics.roundSeconds.Observe(l.cfg.Now().Sub(start).Seconds()) }()
	nodes, err := l.cfg.Nodes.List()
	if err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	settings, err := l.cfg.Checker.Settings()
	if err != nil {
		return nil, err
	}
	l.seedControlPlanes(nodes)
	outcomes := make([]Outcome, len(nodes))
	// Nodes that did not answer last time are checked in a pool of their
	// own: however many are silent, their deadlines take no slot from the
	// nodes that answer.
	var answering, silent []int
	for i, n := range nodes {
		if l.wasUnreachable(n.Name) {
			silent = append(silent, i)
		} else {
			answering = append(answering, i)
		}
	}
	var g errgroup.Group
	for _, pool := range [][]int{answering, silent} {
		g.Go(func() error {
			p, pctx := errgroup.WithContext(ctx)
			p.SetLimit(l.cfg.Concurrency)
			for _, i := range pool {
				p.Go(func() error { return l.checkOne(pctx, nodes[i], settings, &outcomes[i]) })
			}
			return p.Wait()
		})
	}
	err = g.Wait()
	l.updateOldest(nodes)
	l.collect(ctx, nodes)
	return outcomes, err
}

// checkOne checks node, bounded by FetchTimeout, stores its outcome in
// out, and records it. It returns an error only when nothing can be
// judged (no policy).
func (l *Loop) checkOne(ctx context.Context, node *corev1.Node, settings joinconfig.ContinuousAttestation, out *Outcome) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	cctx, cancel := context.WithTimeout(ctx, l.cfg.FetchTimeout)
	o, err := l.cfg.Checker.Check(cctx, node)
	cancel()
	if err != nil {
		return err
	}
	*out = o
	l.metrics.verifications.WithLabelValues(o.Reason).Inc()
	l.mu.Lock()
	l.setStatus(node.Name, o.Reason)
	if o.Reason == ReasonUnreachable {
		l.unreachable[node.Name] = true
	} else {
		delete(l.unreachable, node.Name)
	}
	l.mu.Unlock()
	// A write that fails is tried again next round (or at the next change
	// of the Node); it does not stop the others.
	if err := l.record(ctx, node, o, settings); err != nil && ctx.Err() == nil {
		l.cfg.Log.Warn("Continuous attestation could not record a verdict; the next round tries again", "node", node.Name, "error", err.Error())
	}
	return nil
}

// wasUnreachable reports whether node did not answer at its last check.
func (l *Loop) wasUnreachable(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unreachable[node]
}

// seedControlPlanes sets, for each control plane not judged yet, whether
// its record says it is attested.
func (l *Loop) seedControlPlanes(nodes []*corev1.Node) {
	l.mu.Lock()
	defer l.mu.Unlock()
	present := map[string]bool{}
	for _, n := range nodes {
		if _, cp := n.Labels[labelControlPlane]; !cp {
			continue
		}
		present[n.Name] = true
		if _, ok := l.controlPlanes[n.Name]; !ok {
			cur, err := l.cfg.RecordCache.Current(n.Name)
			l.controlPlanes[n.Name] = err == nil && cur.Record.Attested
		}
	}
	for name := range l.controlPlanes {
		if !present[name] {
			delete(l.controlPlanes, name)
		}
	}
}

// record writes node's verdict o into its authoritative record (when it
// changed, or its heartbeat is due), deciding the taint as settings say,
// and mirrors the record onto the Node.
func (l *Loop) record(ctx context.Context, node *corev1.Node, o Outcome, settings joinconfig.ContinuousAttestation) error {
	now := l.cfg.Now()
	if o.Attested {
		l.mu.Lock()
		l.lastSuccess[node.Name] = now
		l.mu.Unlock()
	}
	cur, err := l.cfg.RecordCache.Current(node.Name)
	if err != nil {
		return err
	}
	var before nodeattestation.Record
	var existed, wrote bool
	rec, err := l.cfg.Records.Update(ctx, node.Name, &cur, func(old nodeattestation.Record, exists bool) (nodeattestation.Record, bool) {
		before, existed = old, exists
		rec := l.decide(node, old, exists, o, settings, now)
		wrote = !exists || !sameVerdict(old, rec) || now.Sub(old.CheckedAt) >= l.cfg.Heartbeat
		return rec, wrote
	})
	if err != nil {
		return err
	}
	changed := !existed || before.Attested != rec.Attested || before.Reason != rec.Reason || before.Message != rec.Message
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
	if wrote {
		l.metrics.recordWrites.Inc()
	}
	if before.Tainted != rec.Tainted { // a new record is untainted before
		l.audit(node, rec)
	}
	return l.mirror(ctx, node, rec)
}

// decide returns node's record after verdict o: the verdict, since when
// it holds, the grace of an unreachable or rebooting node, and the taint.
// The last attested control planes are never tainted: when every control
// plane fails, tainting would leave none, so the loop refuses and says so
// loudly. With `restore: admin` a tainted node stays tainted, and gets no
// credential, until an administrator restores it.
func (l *Loop) decide(node *corev1.Node, old nodeattestation.Record, exists bool, o Outcome, settings joinconfig.ContinuousAttestation, now time.Time) nodeattestation.Record {
	rec := old
	rec.Node, rec.Attested, rec.Reason, rec.Message, rec.Identity = node.Name, o.Attested, o.Reason, truncate(o.Message, 512), o.Identity
	rec.Address = ""
	if o.Address.IsValid() {
		rec.Address = o.Address.String()
	}
	if !exists || old.Attested != o.Attested {
		rec.Since = now
	}
	rec.CheckedAt = now
	failing := !o.Attested
	if o.Reason == ReasonUnreachable || o.Reason == ReasonRebooting {
		if rec.UnreachableSince.IsZero() {
			rec.UnreachableSince = now
		}
		failing = now.Sub(rec.UnreachableSince) >= settings.UnreachableGrace.Duration
	} else {
		rec.UnreachableSince = time.Time{}
	}
	_, cp := node.Labels[labelControlPlane]
	l.mu.Lock()
	defer l.mu.Unlock()
	if cp {
		l.controlPlanes[node.Name] = o.Attested
	}
	switch {
	case settings.Action != joinconfig.ActionTaint:
		rec.Tainted = false
	case failing && !rec.Tainted:
		if cp && !l.otherControlPlaneAttested(node.Name) {
			l.metrics.actions.WithLabelValues("taint_refused").Inc()
			l.cfg.Log.Error("Not tainting control plane "+node.Name+": no other control plane is attested, and tainting would leave the cluster none; "+
				"check the policy and the control planes now", "event", "reattest.action", "node", node.Name, "action", "taint_refused", "reason", o.Reason)
			return rec
		}
		rec.Tainted = true
		rec.AwaitingRestore = settings.Restore == joinconfig.RestoreAdmin
	case failing:
		rec.AwaitingRestore = rec.AwaitingRestore || settings.Restore == joinconfig.RestoreAdmin
	case o.Attested && !rec.AwaitingRestore:
		rec.Tainted = false
	}
	return rec
}

// otherControlPlaneAttested reports whether a control plane other than
// name is attested. l.mu is held.
func (l *Loop) otherControlPlaneAttested(name string) bool {
	for cp, attested := range l.controlPlanes {
		if cp != name && attested {
			return true
		}
	}
	return false
}

// sameVerdict reports whether a and b say the same, heartbeat aside.
func sameVerdict(a, b nodeattestation.Record) bool {
	a.CheckedAt, b.CheckedAt = time.Time{}, time.Time{}
	return a == b
}

// audit logs and counts a change of the taint decision, with an Event.
func (l *Loop) audit(node *corev1.Node, rec nodeattestation.Record) {
	action, kind := "untaint", corev1.EventTypeNormal
	if rec.Tainted {
		action, kind = "taint", corev1.EventTypeWarning
	}
	l.metrics.actions.WithLabelValues(action).Inc()
	l.cfg.Log.Warn("audit", "event", "reattest.action", "node", node.Name, "action", action, "reason", rec.Reason,
		"identity", rec.Identity, "awaitingRestore", rec.AwaitingRestore)
	l.cfg.Events.Eventf(node, nil, kind, action, "Reattest", "%s %s: %s", action, gate.TaintKey, rec.Reason)
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
	for name := range l.unreachable {
		if !present[name] {
			delete(l.unreachable, name)
		}
	}
	for name := range l.status {
		if !present[name] {
			l.setStatus(name, "")
		}
	}
	l.metrics.oldestSuccessAge.Set(oldest.Seconds())
}

// setStatus makes reason node's one gatehouse_reattest_node_status series
// (none when reason is empty), deleting the series of its previous
// reason. l.mu is held.
func (l *Loop) setStatus(node, reason string) {
	if old, ok := l.status[node]; ok && old != reason {
		l.metrics.nodeStatus.DeleteLabelValues(node, old)
	}
	if reason == "" {
		delete(l.status, node)
		return
	}
	l.status[node] = reason
	l.metrics.nodeStatus.WithLabelValues(node, reason).Set(1)
}

// forgetStatus deletes every node's status series and zeroes the oldest
// success age, for a replica that no longer leads.
func (l *Loop) forgetStatus() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for node := range l.status {
		l.setStatus(node, "")
	}
	l.metrics.oldestSuccessAge.Set(0)
}

type metrics struct {
	verifications    *prometheus.CounterVec
	actions          *prometheus.CounterVec
	writes           prometheus.Counter
	recordWrites     prometheus.Counter
	recordsDeleted   prometheus.Counter
	reasserted       *prometheus.CounterVec
	oldestSuccessAge prometheus.Gauge
	roundSeconds     prometheus.Histogram
	nodeStatus       *prometheus.GaugeVec
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
			Help: "Node condition writes: the mirror of a record that changed, or re-asserted after another writer changed it.",
		}),
		recordWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "record_writes_total",
			Help: "Attestation record writes (on a change of outcome, or a due heartbeat).",
		}),
		recordsDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "records_deleted_total",
			Help: "Attestation records deleted because their Node is gone (kept while awaiting an administrator's restore).",
		}),
		reasserted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "mirror_reasserted_total",
			Help: "Node conditions and taints written back after another writer (e.g. the node itself) changed them, by what (condition, taint).",
		}, []string{"what"}),
		oldestSuccessAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "oldest_success_age_seconds",
			Help: "Age of the oldest last successful verification among the Nodes, on the leading replica (0 on the others).",
		}),
		// One series per Node (its current reason), in the style of
		// kube-state-metrics' kube_node_status_condition but without a
		// series per possible reason: the cardinality is the number of
		// Nodes (docs/operations.md, "Metrics").
		nodeStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "node_status",
			Help: "1 for each Node's last verdict, by node and reason (Verified, or why not; the condition's reason), on the leading replica only; a Node's series goes when the Node does.",
		}, []string{"node", "reason"}),
		roundSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gatehouse", Subsystem: "reattest", Name: "round_duration_seconds",
			Help: "Duration of one round over every Node.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
	}
	for _, c := range []prometheus.Collector{m.verifications, m.actions, m.writes, m.recordWrites, m.recordsDeleted, m.reasserted, m.oldestSuccessAge, m.roundSeconds, m.nodeStatus} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return m, nil
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
