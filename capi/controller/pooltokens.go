package controller

import (
	"context"
	"errors"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
)

// A MachinePool's instances all boot from its config's one data Secret, at
// any time: a pool scales up whenever it is told to. So, as CABPK does for
// pools, the token in that data is kept valid for as long as the pool
// exists, and never deleted because nodes have joined. While the pool
// scales (not every replica has a node) the token is extended as a
// Machine's is, also once it has expired if its Secret still exists. Once
// every replica has joined, it is rotated instead when less than half its
// TTL is left (CABPK's rotateMachinePoolBootstrapToken), so that a token
// read from a running instance's data stops working; and a token whose
// Secret is gone is rotated whatever the pool's state.
// Rotating renders the data again with a new token, from the config's spec
// as it is now (as CABPK's recreateBootstrapToken), and rewrites the data
// Secret under its name; the pool's infrastructure provider takes the new
// data the next time it reads the Secret. The token it replaced is not
// extended any more and is deleted once it has expired, so that instances
// launched from the old data in between can still join.

// reconcilePoolToken keeps a MachinePool config's token valid.
func (r *Reconciler) reconcilePoolToken(ctx context.Context, s *scope) (reconcile.Result, error) {
	now := r.clock.Now()
	if due, ok := r.tokenChecks.Load(s.config.UID); ok && now.Before(due.(time.Time)) {
		return reconcile.Result{RequeueAfter: due.(time.Time).Sub(now)}, nil
	}
	wc, err := r.workload.ClientFor(ctx, s.clusterKey())
	if err != nil {
		return reconcile.Result{}, err
	}
	t := &tokens{client: wc, now: r.clock.Now, ttl: r.tokenTTL}
	rotation := tokenRotation(s.config)
	next, rotate, err := t.checkPool(ctx, s.config.UID, rotation, s.owner.joined())
	if err != nil {
		return reconcile.Result{}, err
	}
	if rotate {
		r.tokenChecks.Delete(s.config.UID)
		if ok, res, err := r.rotateToken(ctx, s, rotation+1); !ok {
			return res, err
		}
		// Look at the new token and the replaced one.
		if next, rotate, err = t.checkPool(ctx, s.config.UID, rotation+1, s.owner.joined()); err != nil || rotate {
			// rotate: the new token was an earlier, lost rotation's that has
			// less than half its TTL left; replace it on the next pass.
			return reconcile.Result{RequeueAfter: time.Second}, err
		}
	}
	r.tokenChecks.Store(s.config.UID, now.Add(next))
	return reconcile.Result{RequeueAfter: next}, nil
}

// rotateToken renders the pool's data again with token number rotation,
// creates that token and rewrites the data Secret (writeData), and records
// the number on the config. ok is false when the data could not be made:
// then no token is made, the condition says why, and res and err are the
// reconcile's.
func (r *Reconciler) rotateToken(ctx context.Context, s *scope, rotation int) (ok bool, res reconcile.Result, err error) {
	s.rotation = rotation
	if ok, res, err := r.writeData(ctx, s, render.RoleJoin); !ok {
		return false, res, err
	}
	// managed-bootstrap-token is set, so the annotations are not nil; the
	// patch helper writes the number at the end of the reconcile. Should
	// that fail, the next rotation finds this token again (its id derives
	// from the number) instead of making another.
	s.config.Annotations[annotationTokenRotation] = strconv.Itoa(rotation)
	ctrl.LoggerFrom(ctx).Info("Rotated the MachinePool's bootstrap token and rewrote its data Secret", "rotation", rotation)
	return true, reconcile.Result{}, nil
}

// checkPool looks at a MachinePool config's tokens: it deletes those the
// data no longer carries that have expired, extends the current one
// (number rotation) while the pool scales, expired or not, and says when
// it must be rotated instead: it is gone or holds no token, or every
// replica has joined and less than half the TTL is left. next is when to
// look again.
func (t *tokens) checkPool(ctx context.Context, uid types.UID, rotation int, joined bool) (next time.Duration, rotate bool, err error) {
	current, replacedLeft, err := t.sweep(ctx, uid, tokenName(uid, rotation))
	if err != nil || current == nil {
		return 0, current == nil, err
	}
	tok, ok := bootstraptoken.FromSecret(current)
	if !ok {
		return 0, true, nil // the next sweep deletes it
	}
	// A token whose Secret exists is extended while the pool scales, even
	// when its expiration has passed (nothing looked at it for longer than
	// the TTL), as CABPK's refreshBootstrapTokenIfNeeded does: instances
	// that booted from the data can still join with it.
	switch left := tok.Expiration.Sub(t.now()); {
	case left > t.ttl/2:
		next = left - t.ttl/2
	case joined:
		return 0, true, nil
	default:
		next, err = t.extend(ctx, current, tok)
		if errors.Is(err, errTokenGone) {
			return 0, true, nil // deleted in between
		}
		if err != nil {
			return 0, false, err
		}
	}
	return soonest(next, replacedLeft), false, nil
}

// sweep deletes the config's token Secrets other than the one named
// current that have expired or hold no token. It returns the current one
// (nil when it does not exist) and how long until the first of the others
// that are left expires (0 when none is).
func (t *tokens) sweep(ctx context.Context, uid types.UID, current string) (*corev1.Secret, time.Duration, error) {
	list, err := t.list(ctx, uid)
	if err != nil {
		return nil, 0, err
	}
	now := t.now()
	var cur *corev1.Secret
	var left time.Duration
	for i := range list {
		s := &list[i]
		if s.Name == current {
			cur = s
			continue
		}
		if tok, ok := bootstraptoken.FromSecret(s); ok && tok.Expiration.After(now) {
			left = soonest(left, tok.Expiration.Sub(now))
			continue
		}
		if err := t.delete(ctx, s); err != nil {
			return nil, 0, err
		}
	}
	return cur, left, nil
}

// soonest is the shorter of two durations, where 0 means none.
func soonest(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}
