package controller

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
)

// reconcileDelete removes what the config owns outside its Secret.
func (r *Reconciler) reconcileDelete(ctx context.Context, config *bootstrapv1.KubeadmConfig) error {
	r.tokenChecks.Delete(config.UID)
	if !controllerutil.ContainsFinalizer(config, finalizer) {
		return nil
	}
	log := ctrl.LoggerFrom(ctx)
	if ds := config.Spec.UserDataStore; ds != nil {
		err := r.deleteObject(ctx, config)
		var dse *dataStoreError
		switch {
		case errors.As(err, &dse) || errors.Is(err, userdatastore.ErrBucketNotFound):
			// Nothing to reach it with, or nothing left: retrying cannot help,
			// and a stuck finalizer would hold up the Machine and Cluster.
			log.Info("Leaving the bootstrap data object in place", "bucket", ds.Bucket, "reason", err.Error())
		case err != nil:
			return err
		}
	}
	if config.Annotations[annotationManagedToken] == "true" {
		// The token is no longer extended and expires within its TTL; a
		// workload cluster that is already gone must not block deletion.
		if err := r.removeToken(ctx, config); err != nil {
			log.Info("Leaving the bootstrap token to expire", "reason", err.Error())
		}
	}
	patch := client.MergeFrom(config.DeepCopy())
	controllerutil.RemoveFinalizer(config, finalizer)
	return client.IgnoreNotFound(r.client.Patch(ctx, config, patch))
}

// deleteObject deletes the config's bucket object.
func (r *Reconciler) deleteObject(ctx context.Context, config *bootstrapv1.KubeadmConfig) error {
	store, _, err := r.openStore(ctx, config)
	if err != nil {
		return err
	}
	if err := store.Delete(ctx, objectKey(config)); err != nil {
		return fmt.Errorf("deleting the bootstrap data object: %w", err)
	}
	return nil
}

// removeToken deletes a deleted config's token, unless its workload
// cluster is gone too.
func (r *Reconciler) removeToken(ctx context.Context, config *bootstrapv1.KubeadmConfig) error {
	name := config.Labels[clusterv1.ClusterNameLabel]
	if name == "" {
		return nil
	}
	key := client.ObjectKey{Namespace: config.Namespace, Name: name}
	wc, err := r.workload.ClientFor(ctx, key)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil // the cluster's kubeconfig is gone with the cluster
		}
		return err
	}
	t := &tokens{client: wc, now: r.clock.Now, ttl: r.tokenTTL}
	return t.remove(ctx, config.UID)
}
