package continuous

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
)

// The Node's condition and taint mirror its authoritative record: a node
// may patch its own status (NodeRestriction lets it), so what it says of
// itself is never read; whoever changes the mirror, the loop writes it
// back as soon as the watch shows the change (docs/continuous-attestation.md,
// "The verdict").

// mirrorWorkers bound the Nodes whose mirrors are written back at once.
const mirrorWorkers = 4

// startMirror watches the Nodes and the records and writes a Node's
// mirror back whenever it differs from the record, until stop is called
// or ctx ends.
func (l *Loop) startMirror(ctx context.Context) (stop func(), err error) {
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	removeNodes, err := l.cfg.Nodes.OnChange(func(name string) {
		if l.mirrorDiffers(name) {
			queue.Add(name)
		}
	})
	if err != nil {
		queue.ShutDown()
		return nil, fmt.Errorf("watching the Nodes: %w", err)
	}
	removeRecords, err := l.cfg.RecordCache.OnChange(func(name string) {
		if l.mirrorDiffers(name) {
			queue.Add(name)
		}
	})
	if err != nil {
		removeNodes()
		queue.ShutDown()
		return nil, fmt.Errorf("watching the attestation records: %w", err)
	}
	for range mirrorWorkers {
		go func() {
			for {
				name, quit := queue.Get()
				if quit {
					return
				}
				if err := l.reassert(ctx, name); err != nil && ctx.Err() == nil {
					l.cfg.Log.Warn("Could not write back a Node's attestation condition or taint; retrying", "node", name, "error", err.Error())
					queue.AddRateLimited(name)
				} else {
					queue.Forget(name)
				}
				queue.Done(name)
			}
		}()
	}
	return func() {
		removeNodes()
		removeRecords()
		queue.ShutDown()
	}, nil
}

// mirrorDiffers reports whether the cached Node name does not mirror its
// cached record.
func (l *Loop) mirrorDiffers(name string) bool {
	node, err := l.cfg.Nodes.Get(name)
	if err != nil {
		return false
	}
	cur, err := l.cfg.RecordCache.Current(name)
	if err != nil || !cur.Exists {
		return false
	}
	return !conditionMirrors(node, cur.Record) || hasTaint(node) != cur.Record.Tainted
}

// reassert writes name's mirror back from its record, and says so in the
// audit log: someone else changed it.
func (l *Loop) reassert(ctx context.Context, name string) error {
	node, err := l.cfg.Nodes.Get(name)
	if err != nil {
		return nil // deleted since: nothing to mirror onto
	}
	cur, err := l.cfg.RecordCache.Current(name)
	if err != nil || !cur.Exists {
		return err
	}
	rec := cur.Record
	var what []string
	if !conditionMirrors(node, rec) {
		what = append(what, "condition")
	}
	if hasTaint(node) != rec.Tainted {
		what = append(what, "taint")
	}
	if len(what) == 0 {
		return nil
	}
	for _, w := range what {
		l.metrics.reasserted.WithLabelValues(w).Inc()
	}
	l.cfg.Log.Warn("audit", "event", "reattest.reassert", "node", name, "what", what, "attested", rec.Attested, "reason", rec.Reason,
		"message", "the Node's attestation condition or taint differed from its record (written by someone else, e.g. the node itself); written back")
	return l.mirror(ctx, node, rec)
}

// mirror writes rec onto node where node (as cached) differs: the
// condition, and the taint. The taint is written against the Node as it
// is now, retried on conflict: a node that keeps writing its own status
// cannot keep the taint off.
func (l *Loop) mirror(ctx context.Context, node *corev1.Node, rec nodeattestation.Record) error {
	if !conditionMirrors(node, rec) {
		cond := recordCondition(rec)
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
		if err != nil {
			return err
		}
		// A strategic merge patch: conditions merge by type, others stay.
		if _, err := l.cfg.Client.CoreV1().Nodes().PatchStatus(ctx, node.Name, patch); err != nil {
			return fmt.Errorf("recording the attestation of Node %s: %w", node.Name, err)
		}
		l.metrics.writes.Inc()
	}
	if hasTaint(node) == rec.Tainted {
		return nil
	}
	return l.setTaint(ctx, node.Name, rec.Tainted)
}

// setTaint adds or removes gate.TaintKey on the Node as it is in the API server
// now, retrying on conflict.
func (l *Loop) setTaint(ctx context.Context, name string, taint bool) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := l.cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if hasTaint(node) == taint {
			return nil
		}
		taints := slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == gate.TaintKey })
		if taint {
			taints = append(taints, corev1.Taint{Key: gate.TaintKey, Effect: corev1.TaintEffectNoExecute, TimeAdded: ptr.To(metav1.NewTime(l.cfg.Now()))})
		}
		// Conditional on the Node just read: a conflict reads it again.
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
			"spec":     map[string]any{"taints": taints},
		})
		if err != nil {
			return err
		}
		_, err = l.cfg.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("setting taint %s=%t on Node %s: %w", gate.TaintKey, taint, name, err)
	}
	return nil
}

func hasTaint(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gate.TaintKey })
}

// conditionMirrors reports whether node's condition says what rec says
// (status, reason and message; the times are the record's).
func conditionMirrors(node *corev1.Node, rec nodeattestation.Record) bool {
	want := recordCondition(rec)
	for _, c := range node.Status.Conditions {
		if c.Type == ConditionType {
			return c.Status == want.Status && c.Reason == want.Reason && c.Message == want.Message
		}
	}
	return false
}

// recordCondition is rec as the Node condition.
func recordCondition(rec nodeattestation.Record) corev1.NodeCondition {
	status := corev1.ConditionFalse
	if rec.Attested {
		status = corev1.ConditionTrue
	}
	since := rec.Since
	if since.IsZero() {
		since = rec.CheckedAt
	}
	return corev1.NodeCondition{Type: ConditionType, Status: status, Reason: rec.Reason, Message: truncate(rec.Message, 512),
		LastHeartbeatTime: metav1.NewTime(rec.CheckedAt.Truncate(time.Second)), LastTransitionTime: metav1.NewTime(since.Truncate(time.Second))}
}
