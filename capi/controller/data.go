package controller

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/blang/semver/v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kubeadmtypes "sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types/upstream"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// renderInput gathers what the data is made from. waiting is non-empty
// when something the data needs does not exist yet.
func (r *Reconciler) renderInput(ctx context.Context, s *scope, role render.Role) (in render.Input, waiting string, err error) {
	spec := s.config.Spec.DeepCopy()
	in = render.Input{Spec: spec, Role: role, KubernetesVersion: s.machine.Spec.Version, Arch: spec.Architecture,
		ControlPlane: s.controlPlane()}
	if in.Arch == "" {
		in.Arch = "amd64"
	}
	if in.KubernetesVersion == "" {
		return in, "", specErrorf("Machine %s has no spec.version: set the Kubernetes version", s.machine.Name)
	}
	if err := render.CheckBaseTemplate(in.KubernetesVersion, in.Arch); err != nil {
		return in, "", err
	}
	if in.Files, err = r.resolveFiles(ctx, s.config); err != nil {
		return in, "", err
	}
	if s.attested() {
		// No CA, no token: the join service hands them to the attested machine.
		if role == render.RoleJoin {
			if in.ClusterCAHash, err = r.clusterCAHash(ctx, s); err != nil || in.ClusterCAHash == "" {
				return in, "waiting for the cluster CA (Secret " + secret.Name(s.cluster.Name, secret.ClusterCA) +
					" or the workload cluster's kube-public/cluster-info) to pin the join service to", err
			}
		}
		return in, "", nil
	}
	version, err := semver.ParseTolerant(in.KubernetesVersion)
	if err != nil {
		return in, "", specErrorf("Machine %s: spec.version %q is not a Kubernetes version", s.machine.Name, in.KubernetesVersion)
	}
	if role == render.RoleInit {
		certs := secret.NewCertificatesForInitialControlPlane(&spec.ClusterConfiguration)
		owner := metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: s.cluster.Name, UID: s.cluster.UID}
		if err := certs.LookupOrGenerateCached(ctx, r.client, r.direct(), s.clusterKey(), owner); err != nil {
			setCertificates(s.config, false, ReasonCertificatesGenerationFailed, "looking up or generating the cluster CAs failed")
			return in, "", fmt.Errorf("looking up or generating the cluster CAs: %w", err)
		}
		setCertificates(s.config, true, ReasonCertificatesAvailable, "")
		in.Files = append(in.Files, renderFiles(certs.AsFiles())...)
		in.KubeadmConfig, err = initConfiguration(s, spec, version)
		return in, "", err
	}
	if s.controlPlane() {
		certs := secret.NewControlPlaneJoinCerts(&spec.ClusterConfiguration)
		if err := certs.LookupCached(ctx, r.client, r.direct(), s.clusterKey()); err != nil {
			return in, "", fmt.Errorf("looking up the cluster CAs: %w", err)
		}
		if err := certs.EnsureAllExist(); err != nil {
			setCertificates(s.config, false, ReasonWaitingForClusterCA, "the cluster CA Secrets are missing")
			return in, "a control-plane join needs the cluster CA Secrets (" + secret.Name(s.cluster.Name, secret.ClusterCA) + " and the others)", nil
		}
		setCertificates(s.config, true, ReasonCertificatesAvailable, "")
		in.Files = append(in.Files, renderFiles(certs.AsFiles())...)
		if spec.JoinConfiguration.ControlPlane == nil {
			spec.JoinConfiguration.ControlPlane = &cabpkv1.JoinControlPlane{}
		}
	}
	if waiting, err := r.discovery(ctx, s, &spec.JoinConfiguration); waiting != "" || err != nil {
		return in, waiting, err
	}
	join, err := kubeadmtypes.MarshalJoinConfigurationForVersion(&spec.JoinConfiguration, version)
	if err != nil {
		return in, "", specErrorf("rendering the kubeadm JoinConfiguration: %v", err)
	}
	in.KubeadmConfig = []byte(join)
	return in, "", nil
}

// initConfiguration is kubeadm's ClusterConfiguration and InitConfiguration
// with the Cluster's and Machine's values where the spec leaves them out.
func initConfiguration(s *scope, spec *bootstrapv1.KubeadmConfigSpec, version semver.Version) ([]byte, error) {
	cc := &spec.ClusterConfiguration
	if cc.ControlPlaneEndpoint == "" && s.cluster.Spec.ControlPlaneEndpoint.IsValid() {
		cc.ControlPlaneEndpoint = s.cluster.Spec.ControlPlaneEndpoint.String()
	}
	network := s.cluster.Spec.ClusterNetwork
	data := &upstream.AdditionalData{ClusterName: ptr.To(s.cluster.Name), KubernetesVersion: ptr.To(s.machine.Spec.Version)}
	if network.ServiceDomain != "" {
		data.DNSDomain = ptr.To(network.ServiceDomain)
	}
	if len(network.Services.CIDRBlocks) > 0 {
		data.ServiceSubnet = ptr.To(network.Services.String())
	}
	if len(network.Pods.CIDRBlocks) > 0 {
		data.PodSubnet = ptr.To(network.Pods.String())
	}
	data.ControlPlaneComponentHealthCheckSeconds = spec.InitConfiguration.Timeouts.ControlPlaneComponentHealthCheckSeconds
	clusterData, err := kubeadmtypes.MarshalClusterConfigurationForVersion(cc, version, data)
	if err != nil {
		return nil, specErrorf("rendering the kubeadm ClusterConfiguration: %v", err)
	}
	initData, err := kubeadmtypes.MarshalInitConfigurationForVersion(&spec.InitConfiguration, version)
	if err != nil {
		return nil, specErrorf("rendering the kubeadm InitConfiguration: %v", err)
	}
	return []byte(clusterData + "---\n" + initData), nil
}

// discovery fills in the join's bootstrap token discovery: the API server
// endpoint from the Cluster, the CA hash from the cluster CA and, unless
// the spec brings its own, a bootstrap token made for this config.
func (r *Reconciler) discovery(ctx context.Context, s *scope, join *cabpkv1.JoinConfiguration) (waiting string, err error) {
	if join.Discovery.File.IsDefined() {
		return "", nil
	}
	bt := &join.Discovery.BootstrapToken
	if bt.APIServerEndpoint == "" {
		if !s.cluster.Spec.ControlPlaneEndpoint.IsValid() {
			return "waiting for the Cluster's spec.controlPlaneEndpoint", nil
		}
		bt.APIServerEndpoint = s.cluster.Spec.ControlPlaneEndpoint.String()
	}
	if len(bt.CACertHashes) == 0 && !ptr.Deref(bt.UnsafeSkipCAVerification, false) {
		hash, err := r.clusterCAHash(ctx, s)
		if err != nil || hash == "" {
			return "waiting for the cluster CA Secret " + secret.Name(s.cluster.Name, secret.ClusterCA), err
		}
		bt.CACertHashes = []string{hash}
	}
	if bt.Token != "" {
		return "", nil
	}
	if err := r.ensureFinalizer(ctx, s.config, true); err != nil {
		return "", err
	}
	wc, err := r.workload.ClientFor(ctx, s.clusterKey())
	if err != nil {
		return "", err
	}
	t := &tokens{client: wc, now: r.clock.Now, ttl: r.tokenTTL}
	token, created, err := t.ensure(ctx, s.config.UID, "bootstrap token of KubeadmConfig "+s.config.Namespace+"/"+s.config.Name)
	if err != nil {
		return "", fmt.Errorf("creating the Machine's bootstrap token: %w", err)
	}
	bt.Token = token
	if created {
		r.tokenChecks.Store(s.config.UID, r.clock.Now().Add(r.tokenTTL/2))
	} else {
		// A token found again (a retry) may be older: check it next pass.
		r.tokenChecks.Delete(s.config.UID)
	}
	return "", nil
}

// clusterCAHash is the discovery token CA cert hash of the cluster CA:
// from the "<cluster>-ca" Secret, else (attested clusters, whose CA is made
// on the first node) from the workload cluster's kube-public/cluster-info.
// It is "" when neither exists.
func (r *Reconciler) clusterCAHash(ctx context.Context, s *scope) (string, error) {
	ca, err := secret.GetFromNamespacedName(ctx, fallbackReader{cached: r.client, direct: r.apiReader}, s.clusterKey(), secret.ClusterCA)
	if err == nil {
		return kubeadm.DiscoveryTokenCACertHashPEM(ca.Data[secret.TLSCrtDataName])
	}
	if !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("reading the cluster CA Secret: %w", err)
	}
	if !s.attested() {
		return "", nil
	}
	wc, err := r.workload.ClientFor(ctx, s.clusterKey())
	if err != nil {
		return "", nil //nolint:nilerr // no kubeconfig yet: keep waiting
	}
	cm := &corev1.ConfigMap{}
	if err := wc.Get(ctx, client.ObjectKey{Namespace: metav1.NamespacePublic, Name: "cluster-info"}, cm); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	cfg, err := clientcmd.Load([]byte(cm.Data["kubeconfig"]))
	if err != nil {
		return "", fmt.Errorf("parsing kube-public/cluster-info: %w", err)
	}
	for _, c := range cfg.Clusters {
		return kubeadm.DiscoveryTokenCACertHashPEM(c.CertificateAuthorityData)
	}
	return "", nil
}

// resolveFiles turns the spec's files into render files: Secret contents
// read, encodings undone.
func (r *Reconciler) resolveFiles(ctx context.Context, config *bootstrapv1.KubeadmConfig) ([]render.File, error) {
	var out []render.File
	for _, f := range config.Spec.Files {
		rf := render.File{Path: f.Path, Owner: f.Owner, Permissions: f.Permissions}
		if src := f.ContentFrom.Secret; src.Name != "" {
			sec := &corev1.Secret{}
			if err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: src.Name}, sec); err != nil {
				if apierrors.IsNotFound(err) {
					return nil, specErrorf("file %s: Secret %s (contentFrom) does not exist", f.Path, src.Name)
				}
				return nil, fmt.Errorf("file %s: reading Secret %s: %w", f.Path, src.Name, err)
			}
			data, ok := sec.Data[src.Key]
			if !ok {
				return nil, specErrorf("file %s: Secret %s has no key %q", f.Path, src.Name, src.Key)
			}
			rf.Content, rf.Base64 = base64.StdEncoding.EncodeToString(data), true
			out = append(out, rf)
			continue
		}
		content, err := decodeContent(f)
		if err != nil {
			return nil, specErrorf("file %s: %v", f.Path, err)
		}
		rf.Content, rf.Base64 = content, f.Encoding != ""
		out = append(out, rf)
	}
	return out, nil
}

// decodeContent returns inline content as given, or base64 of its bytes
// when it is base64, gzip or gzip+base64 encoded.
func decodeContent(f cabpkv1.File) (string, error) {
	raw := []byte(f.Content)
	switch f.Encoding {
	case "":
		return f.Content, nil
	case cabpkv1.Base64:
		if _, err := base64.StdEncoding.DecodeString(f.Content); err != nil {
			return "", fmt.Errorf("content is not base64: %w", err)
		}
		return f.Content, nil
	case cabpkv1.GzipBase64:
		b, err := base64.StdEncoding.DecodeString(f.Content)
		if err != nil {
			return "", fmt.Errorf("content is not base64: %w", err)
		}
		raw = b
		fallthrough
	case cabpkv1.Gzip:
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return "", fmt.Errorf("content is not gzip: %w", err)
		}
		out, err := io.ReadAll(io.LimitReader(zr, 16<<20))
		if err != nil {
			return "", fmt.Errorf("content is not gzip: %w", err)
		}
		return base64.StdEncoding.EncodeToString(out), nil
	default:
		return "", fmt.Errorf("unknown encoding %q", f.Encoding)
	}
}

func renderFiles(files []cabpkv1.File) []render.File {
	out := make([]render.File, 0, len(files))
	for _, f := range files {
		out = append(out, render.File{Path: f.Path, Content: f.Content, Owner: f.Owner, Permissions: f.Permissions})
	}
	return out
}

func setCertificates(config *bootstrapv1.KubeadmConfig, ok bool, reason, message string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	setCondition(config, ConditionCertificatesAvailable, status, reason, message)
}

// ensureFinalizer adds the cleanup finalizer (and marks a managed token)
// before anything outside the config's Secret is created.
func (r *Reconciler) ensureFinalizer(ctx context.Context, config *bootstrapv1.KubeadmConfig, managedToken bool) error {
	if controllerutil.ContainsFinalizer(config, Finalizer) && (!managedToken || config.Annotations[annotationManagedToken] == "true") {
		return nil
	}
	patch := client.MergeFrom(config.DeepCopy())
	controllerutil.AddFinalizer(config, Finalizer)
	if managedToken {
		if config.Annotations == nil {
			config.Annotations = map[string]string{}
		}
		config.Annotations[annotationManagedToken] = "true"
	}
	if err := r.client.Patch(ctx, config, patch); err != nil {
		return fmt.Errorf("adding the cleanup finalizer: %w", err)
	}
	return nil
}

// storeData writes the data Secret (or the bucket object and a stub).
func (r *Reconciler) storeData(ctx context.Context, s *scope, data []byte) error {
	format := s.config.Spec.Format
	if format == "" {
		format = bootstrapv1.FormatCloudConfig
	}
	if ds := s.config.Spec.UserDataStore; ds != nil {
		store, caPEM, err := r.openStore(ctx, s.config)
		if err != nil {
			return err
		}
		if err := r.ensureFinalizer(ctx, s.config, false); err != nil {
			return err
		}
		key := objectKey(s.config)
		if err := store.Put(ctx, key, data); err != nil {
			return specErrorf("storing the bootstrap data in bucket %s at %s: %v", ds.Bucket, ds.Endpoint, err)
		}
		if data, err = stub(ctx, store, ds, format, key, caPEM); err != nil {
			return err
		}
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
	if err := r.client.Create(ctx, sec); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the data Secret: %w", err)
		}
		// A retry after a lost status update: the Secret must be this config's.
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
			return fmt.Errorf("updating the data Secret: %w", err)
		}
	}
	s.config.Status.DataSecretName = ptr.To(sec.Name)
	s.config.Status.Initialization = &bootstrapv1.Initialization{DataSecretCreated: ptr.To(true)}
	return nil
}

// stub is the small data pointing at the bucket object.
// caPEM is the store's CA from the credentials Secret, if any: Ignition
// gets it to trust; cloud-init cannot be told (its CA must be in the image).
func stub(ctx context.Context, store ObjectStore, ds *bootstrapv1.UserDataStore, format bootstrapv1.Format, key string, caPEM []byte) ([]byte, error) {
	if ds.Stub == "s3-uri" {
		if format != bootstrapv1.FormatIgnition {
			return nil, specErrorf("an s3-uri stub needs format ignition")
		}
		return userdatastore.IgnitionStub(store.S3URI(key), nil)
	}
	ttl := 24 * time.Hour
	if ds.PresignedURLTTL != nil {
		ttl = ds.PresignedURLTTL.Duration
	}
	u, err := store.PresignedGetURL(ctx, key, ttl)
	if err != nil {
		return nil, specErrorf("presigning the bootstrap data URL: %v", err)
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
			return nil, nil, specErrorf("userDataStore: credentials Secret %s does not exist", ds.CredentialsSecret)
		}
		return nil, nil, fmt.Errorf("reading the userDataStore credentials Secret: %w", err)
	}
	cfg := userdatastore.Config{Endpoint: ds.Endpoint, Bucket: ds.Bucket, Region: ds.Region,
		AccessKeyID: string(creds.Data["accessKeyID"]), SecretAccessKey: string(creds.Data["secretAccessKey"]),
		ServerSideEncryption: ptr.Deref(ds.ServerSideEncryption, true)}
	if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
		return nil, nil, specErrorf("userDataStore: credentials Secret %s needs the keys accessKeyID and secretAccessKey", ds.CredentialsSecret)
	}
	if caPEM = creds.Data["ca.crt"]; len(caPEM) > 0 {
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(caPEM) {
			return nil, nil, specErrorf("userDataStore: ca.crt in Secret %s holds no PEM certificate", ds.CredentialsSecret)
		}
	}
	if store, err = r.stores(cfg); err != nil {
		return nil, nil, specErrorf("userDataStore: %v", err)
	}
	return store, caPEM, nil
}

// direct is the client with reads going straight to the API server: for
// Secrets the cache does not hold (a user's CA Secret without the
// cluster-name label).
func (r *Reconciler) direct() client.Client {
	return directClient{Client: r.client, reader: r.apiReader}
}

type directClient struct {
	client.Client
	reader client.Reader
}

func (d directClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return d.reader.Get(ctx, key, obj, opts...)
}
