package controller

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
)

// A MachinePool's instances boot from its one data Secret at any time, so
// a presigned URL in its userDataStore stub must stay valid for as long as
// the pool exists, as its token does. The URL works for presignedURLTTL
// after it was made; once less than half of that is left (the rule the
// tokens follow), the controller presigns a new URL for the same bucket
// object and rewrites the stub in the data Secret. Nothing is rendered
// again and no token is made: the object, and the token in it, stay as
// they are. This holds for attested pools too. A Machine boots once, from
// the URL it was given, and needs none of this.
//
// The URL's expiry is recorded on the config (annotationPresignedURLExpiry)
// when the stub is written, from the controller's clock taken before
// presigning, so it is never later than the URL's own. A config without
// it (its data written by an earlier version, or the status patch that
// carried it lost) gets a new URL at the next reconcile.

// annotationPresignedURLExpiry is when the presigned URL in a MachinePool
// config's data Secret expires (RFC 3339).
const annotationPresignedURLExpiry = "bootstrap.gatehouse.dev/presigned-url-expiry"

// defaultPresignedURLTTL is a presigned URL's lifetime when the spec sets
// none (the CRD defaults it to this too).
const defaultPresignedURLTTL = 24 * time.Hour

// presignedURLTTL is how long the config's presigned URLs are valid, in
// whole seconds as they are signed.
func presignedURLTTL(ds *bootstrapv1.UserDataStore) time.Duration {
	if ds.PresignedURLTTL == nil {
		return defaultPresignedURLTTL
	}
	return ds.PresignedURLTTL.Truncate(time.Second)
}

// renewsPresignedURL says the config's stub is a presigned URL that must be
// renewed: a MachinePool's with a presigned-url userDataStore.
func renewsPresignedURL(s *scope) bool {
	ds := s.config.Spec.UserDataStore
	return s.owner.pool != nil && ds != nil && ds.Stub != "s3-uri"
}

func setPresignedURLExpiry(config *bootstrapv1.KubeadmConfig, expiry time.Time) {
	if config.Annotations == nil {
		config.Annotations = map[string]string{}
	}
	config.Annotations[annotationPresignedURLExpiry] = expiry.UTC().Format(time.RFC3339)
}

// presignedURLDue is how long until the config's presigned URL must be
// renewed: 0 once less than half its TTL is left, and also when its
// expiry is unknown or further away than the TTL (the spec's TTL was
// shortened, or the clock went back).
func (r *Reconciler) presignedURLDue(config *bootstrapv1.KubeadmConfig) time.Duration {
	expiry, err := time.Parse(time.RFC3339, config.Annotations[annotationPresignedURLExpiry])
	if err != nil {
		return 0
	}
	ttl := presignedURLTTL(config.Spec.UserDataStore)
	left := expiry.Sub(r.clock.Now())
	if left <= ttl/2 || left > ttl {
		return 0
	}
	return left - ttl/2
}

// renewPresignedURL presigns a new URL for the config's bucket object and
// rewrites the data Secret's stub with it.
func (r *Reconciler) renewPresignedURL(ctx context.Context, s *scope) error {
	store, caPEM, err := r.openStore(ctx, s.config)
	if err != nil {
		return err
	}
	if err := r.writeStub(ctx, s, store, caPEM); err != nil {
		return err
	}
	// Not the URL: it is a credential for the data until it expires.
	ctrl.LoggerFrom(ctx).Info("Renewed the presigned URL in the MachinePool's data Secret",
		"expiry", s.config.Annotations[annotationPresignedURLExpiry])
	return nil
}
