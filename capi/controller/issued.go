package controller

// The reconcile of a config that has its data already (Reconcile's
// "already issued" branch): the data stays usable for as long as its
// owner needs it.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// reconcileIssued keeps the data of a config that has it usable: it renews
// a MachinePool's presigned URL when due, then looks after the token
// (reconcileToken), and requeues in time for whichever comes first. A
// renewal that fails is reported (storeFailed: UserDataStoreFailed for the
// bucket's credentials or the presigning) and retried; the token is looked
// after all the same.
func (r *Reconciler) reconcileIssued(ctx context.Context, s *scope) (reconcile.Result, error) {
	if !renewsPresignedURL(s) || s.config.Status.DataSecretName == nil {
		return r.reconcileToken(ctx, s)
	}
	var failed reconcile.Result
	if r.presignedURLDue(s.config) == 0 {
		if err := r.renewPresignedURL(ctx, s); err != nil {
			res, err := storeFailed(s, err)
			if err != nil {
				return res, err
			}
			failed = res
		} else {
			setDataAvailable(s.config)
		}
	}
	res, err := r.reconcileToken(ctx, s)
	if err != nil {
		return res, err
	}
	next := failed.RequeueAfter
	if next == 0 {
		// The token's rotation may have written a new URL.
		next = r.presignedURLDue(s.config)
	}
	res.RequeueAfter = soonest(res.RequeueAfter, next)
	return res, nil
}

// managesToken says the config's data carries a token this controller made.
func managesToken(s *scope) bool {
	return s.config.Status.DataSecretName != nil && s.config.Annotations[annotationManagedToken] == "true"
}

// annotationManagedToken marks configs whose data holds a bootstrap token
// this controller created (and so extends and deletes).
const annotationManagedToken = "bootstrap.gatehouse.dev/managed-bootstrap-token" //nolint:gosec // an annotation name, not a credential

// reconcileToken extends the Machine's bootstrap token until its node has
// joined, then deletes it; a MachinePool's is kept valid for as long as the
// pool exists (reconcilePoolToken).
func (r *Reconciler) reconcileToken(ctx context.Context, s *scope) (reconcile.Result, error) {
	if !managesToken(s) {
		return reconcile.Result{}, nil
	}
	if s.owner.pool != nil {
		return r.reconcilePoolToken(ctx, s)
	}
	joined := s.owner.joined()
	now := r.clock.Now()
	if due, ok := r.tokenChecks.Load(s.config.UID); ok && !joined && now.Before(due.(time.Time)) {
		return reconcile.Result{RequeueAfter: due.(time.Time).Sub(now)}, nil
	}
	wc, err := r.workload.ClientFor(ctx, s.clusterKey())
	if err != nil {
		return reconcile.Result{}, err
	}
	t := &tokens{client: wc, now: r.clock.Now, ttl: r.tokenTTL}
	if joined {
		if err := t.remove(ctx, s.config.UID); err != nil {
			return reconcile.Result{}, err
		}
		r.tokenChecks.Delete(s.config.UID)
		// Done with the token: later reconciles need not reach the
		// workload cluster, nor does the deletion (the patch helper writes
		// this at the end of the reconcile).
		delete(s.config.Annotations, annotationManagedToken)
		if s.config.Spec.UserDataStore == nil {
			controllerutil.RemoveFinalizer(s.config, finalizer)
		}
		return reconcile.Result{}, nil
	}
	name := tokenName(s.config.UID, tokenRotation(s.config))
	next, err := t.refresh(ctx, s.config.UID, tokenRotation(s.config))
	if errors.Is(err, errTokenGone) {
		// As CABPK, a Machine's token is not made again: its data may be on
		// a machine already, and a deleted token may have been revoked.
		r.tokenChecks.Delete(s.config.UID)
		setWaiting(s.config, ReasonBootstrapTokenExpired, fmt.Sprintf("the Machine's bootstrap token Secret %s/%s in the workload cluster "+
			"no longer exists (the token cleaner removes a token once it has expired, or it was deleted) and the node has not joined: "+
			"delete the Machine to replace it", metav1.NamespaceSystem, name))
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if c := meta.FindStatusCondition(s.config.Status.Conditions, ConditionDataSecretAvailable); c != nil && c.Reason == ReasonBootstrapTokenExpired {
		setDataAvailable(s.config) // the Secret was restored
	}
	r.tokenChecks.Store(s.config.UID, now.Add(next))
	return reconcile.Result{RequeueAfter: next}, nil
}
