package continuous

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// minRecordRetention is the least time the attestation record of a Node
// that no longer exists is kept after its last check; the loop keeps it
// for ten intervals when that is longer.
const minRecordRetention = 10 * time.Minute

// retention is how long a gone Node's record is kept after its last check.
func (l *Loop) retention() time.Duration {
	return max(10*l.cfg.Interval, minRecordRetention)
}

// collect deletes the records of Nodes that are gone (not in nodes, the
// round's list) and were last checked more than the retention ago, so
// records do not pile up as machines come and go. A record awaiting an
// administrator's restore is kept whatever its age: the decision outlives
// the Node, and a machine rejoining under that name must still be
// restored first (the gate reads it). Each deletion is conditional on the
// record being unchanged since the cache read it, audited and counted.
func (l *Loop) collect(ctx context.Context, nodes []*corev1.Node) {
	present := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		present[n.Name] = true
	}
	records, err := l.cfg.RecordCache.List()
	if err != nil {
		l.cfg.Log.Warn("Listing attestation records to collect failed", "error", err.Error())
		return
	}
	now, keep := l.cfg.Now(), l.retention()
	for _, cur := range records {
		r := cur.Record
		if present[r.Node] || r.AwaitingRestore || now.Sub(r.CheckedAt) < keep {
			continue
		}
		if err := l.cfg.Records.Delete(ctx, r.Node, cur.ResourceVersion); err != nil {
			l.cfg.Log.Warn("Deleting the attestation record of a gone Node failed", "node", r.Node, "error", err.Error())
			continue
		}
		l.metrics.recordsDeleted.Inc()
		l.cfg.Log.Info("audit", "event", "reattest.record_deleted", "node", r.Node,
			"checkedAt", r.CheckedAt.UTC().Format(time.RFC3339), "why", "the Node no longer exists")
	}
}
