package controller

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
)

// storeData writes the data Secret, or the object in store (the config's
// opened userDataStore, whose CA is caPEM) and a stub.
func (r *Reconciler) storeData(ctx context.Context, s *scope, data []byte, store ObjectStore, caPEM []byte) error {
	if ds := s.config.Spec.UserDataStore; ds != nil {
		if err := store.Put(ctx, objectKey(s.config), data); err != nil {
			return dataStoreErrorf("storing the bootstrap data in bucket %s at %s: %v", ds.Bucket, ds.Endpoint, err)
		}
		return r.writeStub(ctx, s, store, caPEM)
	}
	return r.writeSecret(ctx, s, data)
}

// writeStub writes the data Secret with a stub pointing at the config's
// bucket object. A MachinePool's presigned URL is renewed before it
// expires (presignedurl.go): its expiry is recorded on the config.
func (r *Reconciler) writeStub(ctx context.Context, s *scope, store ObjectStore, caPEM []byte) error {
	ds := s.config.Spec.UserDataStore
	// Taken before presigning: the URL expires no earlier than this says.
	now := r.clock.Now()
	data, err := stub(ctx, store, ds, dataFormat(s.config), objectKey(s.config), caPEM)
	if err != nil {
		return err
	}
	if err := r.writeSecret(ctx, s, data); err != nil {
		return err
	}
	if renewsPresignedURL(s) {
		setPresignedURLExpiry(s.config, now.Add(presignedURLTTL(ds)))
	}
	return nil
}

// writeSecret writes data into the config's data Secret: it creates it,
// or rewrites it when the config has data already.
func (r *Reconciler) writeSecret(ctx context.Context, s *scope, data []byte) error {
	format := dataFormat(s.config)
	if err := checkSize(s.config, data, format); err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      s.config.Name,
			Namespace: s.config.Namespace,
			Labels:    map[string]string{clusterv1.ClusterNameLabel: s.cluster.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: bootstrapv1.GroupVersion.String(), Kind: "KubeadmConfig",
				Name: s.config.Name, UID: s.config.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": data, "format": []byte(format)},
	}
	// A config with data has its Secret: a MachinePool's token rotation,
	// or the renewal of its presigned URL, rewrites it under the same name.
	if s.config.Status.DataSecretName != nil {
		return r.rewriteData(ctx, s, sec)
	}
	if err := r.client.Create(ctx, sec); err != nil {
		if apierrors.IsRequestEntityTooLargeError(err) {
			return tooLargeForAPIServer(data, err)
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the data Secret: %w", err)
		}
		// A retry after a lost status update.
		if err := r.rewriteData(ctx, s, sec); err != nil {
			return err
		}
	}
	s.config.Status.DataSecretName = ptr.To(sec.Name)
	s.config.Status.Initialization = &bootstrapv1.Initialization{DataSecretCreated: ptr.To(true)}
	return nil
}

// rewriteData writes sec's data into the existing data Secret, which must
// be the config's.
func (r *Reconciler) rewriteData(ctx context.Context, s *scope, sec *corev1.Secret) error {
	existing := &corev1.Secret{}
	if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(sec), existing); err != nil {
		return fmt.Errorf("reading the data Secret: %w", err)
	}
	if !metav1.IsControlledBy(existing, s.config) {
		return specErrorf("Secret %s exists and does not belong to this KubeadmConfig: delete or rename it", sec.Name)
	}
	patch := client.MergeFrom(existing.DeepCopy())
	existing.Data = sec.Data
	if err := r.client.Patch(ctx, existing, patch); err != nil {
		if apierrors.IsRequestEntityTooLargeError(err) {
			return tooLargeForAPIServer(sec.Data["value"], err)
		}
		return fmt.Errorf("updating the data Secret: %w", err)
	}
	return nil
}

func tooLargeForAPIServer(data []byte, err error) error {
	return &sizeError{msg: fmt.Sprintf("the API server refused the %d-byte data Secret as too large (%v): %s", len(data), err, sizeFix)}
}

// dataFormat is the config's format, cloud-config when unset.
func dataFormat(config *bootstrapv1.KubeadmConfig) bootstrapv1.Format {
	if config.Spec.Format == "" {
		return bootstrapv1.FormatCloudConfig
	}
	return config.Spec.Format
}

// stub is the small data pointing at the bucket object.
// caPEM is the store's CA from the credentials Secret, if any: Ignition
// gets it to trust; cloud-init cannot be told (its CA must be in the image).
func stub(ctx context.Context, store ObjectStore, ds *bootstrapv1.UserDataStore, format bootstrapv1.Format, key string, caPEM []byte) ([]byte, error) {
	if ds.Stub == "s3-uri" {
		if format != bootstrapv1.FormatIgnition {
			return nil, dataStoreErrorf("an s3-uri stub needs format ignition")
		}
		return userdatastore.IgnitionStub(store.S3URI(key), nil)
	}
	u, err := store.PresignedGetURL(ctx, key, presignedURLTTL(ds))
	if err != nil {
		return nil, dataStoreErrorf("presigning the bootstrap data URL: %v", err)
	}
	if format == bootstrapv1.FormatIgnition {
		return userdatastore.IgnitionStub(u.String(), caPEM)
	}
	return userdatastore.CloudConfigStub(u), nil
}

// ObjectStore keeps bootstrap data objects in a bucket.
type ObjectStore interface {
	Put(ctx context.Context, key string, data []byte) error
	PresignedGetURL(ctx context.Context, key string, ttl time.Duration) (*url.URL, error)
	S3URI(key string) string
	Delete(ctx context.Context, key string) error
}

// StoreFactory opens the bucket of a config's userDataStore.
type StoreFactory func(userdatastore.Config) (ObjectStore, error)

func s3Stores(cfg userdatastore.Config) (ObjectStore, error) { return userdatastore.New(cfg) }

func objectKey(config *bootstrapv1.KubeadmConfig) string {
	return userdatastore.ObjectKey(config.Namespace, config.Name, config.UID)
}

// openStore reads the bucket credentials and opens the config's store.
func (r *Reconciler) openStore(ctx context.Context, config *bootstrapv1.KubeadmConfig) (store ObjectStore, caPEM []byte, err error) {
	ds := config.Spec.UserDataStore
	creds := &corev1.Secret{}
	if err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: ds.CredentialsSecret}, creds); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, dataStoreErrorf("credentials Secret %s does not exist", ds.CredentialsSecret)
		}
		return nil, nil, fmt.Errorf("reading the userDataStore credentials Secret: %w", err)
	}
	cfg := userdatastore.Config{Endpoint: ds.Endpoint, Bucket: ds.Bucket, Region: ds.Region,
		AccessKeyID: string(creds.Data["accessKeyID"]), SecretAccessKey: string(creds.Data["secretAccessKey"]),
		ServerSideEncryption: ptr.Deref(ds.ServerSideEncryption, true)}
	if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
		return nil, nil, dataStoreErrorf("credentials Secret %s needs the keys accessKeyID and secretAccessKey", ds.CredentialsSecret)
	}
	if caPEM = creds.Data["ca.crt"]; len(caPEM) > 0 {
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(caPEM) {
			return nil, nil, dataStoreErrorf("ca.crt in Secret %s holds no PEM certificate", ds.CredentialsSecret)
		}
	}
	if store, err = r.stores(cfg); err != nil {
		return nil, nil, &dataStoreError{err: err}
	}
	return store, caPEM, nil
}

// defaultMaxUserDataSize is the user-data limit of a config without
// spec.maxUserDataSize: 16 KiB raw, the smallest common cloud limit
// (Amazon EC2's).
const defaultMaxUserDataSize = 16 << 10

// sizeFix is what a too large data can do instead.
const sizeFix = "keep the data in a bucket with spec.userDataStore (the Machine then gets a small stub), " +
	"or make it smaller, e.g. gzip large files (files[].encoding: gzip+base64)"

// sizeError is data too large for the Machine's user data or for the data
// Secret, reported as the UserDataTooLarge condition.
type sizeError struct{ msg string }

func (e *sizeError) Error() string { return e.msg }

// checkSize refuses data (raw, the Secret's "value") over the config's
// user-data limit or over what a Secret holds beside the format key.
func checkSize(config *bootstrapv1.KubeadmConfig, data []byte, format bootstrapv1.Format) error {
	limit := int64(defaultMaxUserDataSize)
	if q := config.Spec.MaxUserDataSize; q != nil {
		if limit = q.Value(); limit <= 0 {
			return specErrorf("spec.maxUserDataSize %s is not a positive size", q)
		}
	}
	size, secretLimit := int64(len(data)), int64(corev1.MaxSecretSize-len(format))
	switch {
	case size > limit && limit <= secretLimit:
		return &sizeError{msg: fmt.Sprintf("the bootstrap data is %d bytes raw, over the user-data limit of %d bytes "+
			"(spec.maxUserDataSize; unset it is 16Ki, the smallest common cloud limit, and you may raise it to what your infrastructure takes): %s",
			size, limit, sizeFix)}
	case size > secretLimit:
		return &sizeError{msg: fmt.Sprintf("the bootstrap data is %d bytes raw, over the %d bytes a Kubernetes Secret holds with it: %s",
			size, secretLimit, sizeFix)}
	}
	return nil
}

// storeFailed reports a failure to store the data: a bucket's as the
// UserDataStoreFailed condition (retried), data too large as
// UserDataTooLarge, the user's objects' as InvalidSpec.
func storeFailed(s *scope, err error) (reconcile.Result, error) {
	var dse *dataStoreError
	var se *specError
	var size *sizeError
	switch {
	case errors.As(err, &dse):
		setWaiting(s.config, ReasonUserDataStoreFailed, dse.Error())
		return reconcile.Result{RequeueAfter: waitRequeue}, nil
	case errors.As(err, &size):
		setWaiting(s.config, ReasonUserDataTooLarge, size.Error())
		return reconcile.Result{}, nil
	case errors.As(err, &se):
		setWaiting(s.config, ReasonInvalidSpec, se.Error())
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, err
}
