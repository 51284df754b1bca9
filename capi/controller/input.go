package controller

import (
	"context"
	"fmt"

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
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// wait says why a config's data cannot be made yet: the reason and message
// of its DataSecretAvailable=False condition. The reconciler looks again
// after waitRequeue.
type wait struct {
	reason, message string
}

// renderInput gathers what the data is made from, by role as CABPK does
// (handleClusterNotInitialized, joinControlplane, joinWorker), with
// attested Machines apart: their data holds no secret. A non-nil wait means
// something the data needs does not exist yet.
func (r *Reconciler) renderInput(ctx context.Context, s *scope, role render.Role) (render.Input, *wait, error) {
	in, err := r.commonInput(ctx, s, role)
	if err != nil {
		return in, nil, err
	}
	switch {
	case s.attested():
		w, err := r.attestedInput(ctx, s, role, &in)
		return in, w, err
	case role == render.RoleInit:
		return in, nil, r.initInput(ctx, s, &in)
	case s.controlPlane():
		w, err := r.joinControlPlaneInput(ctx, s, &in)
		return in, w, err
	default:
		addUninitializedTaint(&in.Spec.JoinConfiguration.NodeRegistration)
		w, err := r.joinInput(ctx, s, &in)
		return in, w, err
	}
}

// addUninitializedTaint adds Cluster API's node.cluster.x-k8s.io/uninitialized
// NoSchedule taint to a worker's join, as CABPK's joinWorker does: nothing
// schedules on the node until Cluster API's Machine controller has synced
// the Machine's labels to it and removed the taint. Only the rendered copy
// of the spec changes.
func addUninitializedTaint(reg *cabpkv1.NodeRegistrationOptions) {
	taints := ptr.Deref(reg.Taints, nil)
	for _, t := range taints {
		if t.MatchTaint(&clusterv1.NodeUninitializedTaint) {
			return
		}
	}
	reg.Taints = ptr.To(append(taints[:len(taints):len(taints)], clusterv1.NodeUninitializedTaint))
}

// commonInput is what every role's data has: the spec, version,
// architecture (amd64 by default) and files.
func (r *Reconciler) commonInput(ctx context.Context, s *scope, role render.Role) (render.Input, error) {
	spec := s.config.Spec.DeepCopy()
	in := render.Input{Spec: spec, Role: role, KubernetesVersion: s.owner.version(), Arch: spec.Architecture,
		ControlPlane: s.controlPlane()}
	if in.Arch == "" {
		in.Arch = "amd64"
	}
	if in.KubernetesVersion == "" {
		return in, specErrorf("%s %s has no %s: set the Kubernetes version", s.owner.kind(), s.owner.name(), s.owner.versionField())
	}
	var err error
	if in.Components, err = r.templates.Components(ctx, in.KubernetesVersion, in.Arch); err != nil {
		return in, err
	}
	if repo := r.mirror.ImageRepository(); repo != "" && spec.ClusterConfiguration.ImageRepository == "" {
		// kubeadm pulls the control plane's images from the mirror
		// (docs/install-airgapped.md); a config's own imageRepository wins.
		spec.ClusterConfiguration.ImageRepository = repo
		if spec.ClusterConfiguration.DNS.ImageRepository == "" {
			spec.ClusterConfiguration.DNS.ImageRepository = r.mirror.DNSImageRepository()
		}
	}
	if err := r.resolveUsers(ctx, s.config, spec); err != nil {
		return in, err
	}
	if in.Files, err = r.resolveFiles(ctx, s.config, s.cluster); err != nil {
		return in, err
	}
	if s.attested() {
		// An attested Machine's containerd gets the mirror from its join
		// ticket (the join configuration's imageMirror): the node image's
		// /etc is read-only, and its hosts files live on the state disk.
		return in, nil
	}
	hosts, err := containerdHostsFiles(r.mirror)
	in.Files = append(in.Files, hosts...)
	return in, err
}

// version is the owner's Kubernetes version, parsed.
func version(s *scope, in *render.Input) (semver.Version, error) {
	v, err := semver.ParseTolerant(in.KubernetesVersion)
	if err != nil {
		return v, specErrorf("%s %s: %s %q is not a Kubernetes version", s.owner.kind(), s.owner.name(), s.owner.versionField(), in.KubernetesVersion)
	}
	return v, nil
}

// attestedInput: no CA, no token; the join service hands them to the
// attested Machine. A joining Machine gets the cluster CA's hash to pin the
// join service to.
func (r *Reconciler) attestedInput(ctx context.Context, s *scope, role render.Role, in *render.Input) (*wait, error) {
	if role != render.RoleJoin {
		return nil, nil
	}
	var err error
	if in.ClusterCAHash, err = r.clusterCAHash(ctx, s); err != nil || in.ClusterCAHash == "" {
		return &wait{ReasonWaitingForClusterCA, "waiting for the cluster CA (Secret " + secret.Name(s.cluster.Name, secret.ClusterCA) +
			" or the workload cluster's kube-public/cluster-info) to pin the join service to"}, err
	}
	return nil, nil
}

// initInput is the first control plane's: the cluster CAs, looked up or
// generated (Cluster API's certificate conventions), and kubeadm's
// ClusterConfiguration and InitConfiguration.
func (r *Reconciler) initInput(ctx context.Context, s *scope, in *render.Input) error {
	v, err := version(s, in)
	if err != nil {
		return err
	}
	certs := secret.NewCertificatesForInitialControlPlane(&in.Spec.ClusterConfiguration)
	owner := metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: s.cluster.Name, UID: s.cluster.UID}
	if err := certs.LookupOrGenerateCached(ctx, r.client, r.direct(), s.clusterKey(), owner); err != nil {
		setCertificates(s.config, false, ReasonCertificatesGenerationFailed, "looking up or generating the cluster CAs failed")
		return fmt.Errorf("looking up or generating the cluster CAs: %w", err)
	}
	setCertificates(s.config, true, ReasonCertificatesAvailable, "")
	in.Files = append(in.Files, renderFiles(certs.AsFiles())...)
	in.KubeadmConfig, err = initConfiguration(s, in.Spec, v)
	return err
}

// joinControlPlaneInput is a joining control plane's: the cluster CAs,
// which must exist, and the join.
func (r *Reconciler) joinControlPlaneInput(ctx context.Context, s *scope, in *render.Input) (*wait, error) {
	certs := secret.NewControlPlaneJoinCerts(&in.Spec.ClusterConfiguration)
	problem, err := r.joinCAProblem(ctx, s.clusterKey(), certs)
	if err != nil {
		return nil, err
	}
	if problem == "" {
		if err := certs.LookupCached(ctx, r.client, r.direct(), s.clusterKey()); err != nil {
			return nil, fmt.Errorf("looking up the cluster CAs: %w", err)
		}
		if err := certs.EnsureAllExist(); err != nil {
			problem = "a control-plane join needs the cluster CA Secrets: " + err.Error() // changed since read
		}
	}
	if problem != "" {
		setCertificates(s.config, false, ReasonWaitingForClusterCA, problem)
		return &wait{ReasonWaitingForClusterCA, problem}, nil
	}
	setCertificates(s.config, true, ReasonCertificatesAvailable, "")
	in.Files = append(in.Files, renderFiles(certs.AsFiles())...)
	if in.Spec.JoinConfiguration.ControlPlane == nil {
		in.Spec.JoinConfiguration.ControlPlane = &cabpkv1.JoinControlPlane{}
	}
	return r.joinInput(ctx, s, in)
}

// joinInput is a join's kubeadm JoinConfiguration, with bootstrap token
// discovery filled in.
func (r *Reconciler) joinInput(ctx context.Context, s *scope, in *render.Input) (*wait, error) {
	v, err := version(s, in)
	if err != nil {
		return nil, err
	}
	if w, err := r.discovery(ctx, s, in); w != nil || err != nil {
		return w, err
	}
	return nil, joinConfiguration(in, v)
}

// joinConfiguration is kubeadm's JoinConfiguration of the input's spec.
func joinConfiguration(in *render.Input, v semver.Version) error {
	join, err := kubeadmtypes.MarshalJoinConfigurationForVersion(&in.Spec.JoinConfiguration, v)
	if err != nil {
		return specErrorf("rendering the kubeadm JoinConfiguration: %v", err)
	}
	in.KubeadmConfig = []byte(join)
	return nil
}

// initConfiguration is kubeadm's ClusterConfiguration and InitConfiguration
// with the Cluster's and Machine's values where the spec leaves them out.
func initConfiguration(s *scope, spec *bootstrapv1.KubeadmConfigSpec, version semver.Version) ([]byte, error) {
	cc := &spec.ClusterConfiguration
	if cc.ControlPlaneEndpoint == "" && s.cluster.Spec.ControlPlaneEndpoint.IsValid() {
		cc.ControlPlaneEndpoint = s.cluster.Spec.ControlPlaneEndpoint.String()
	}
	network := s.cluster.Spec.ClusterNetwork
	data := &upstream.AdditionalData{ClusterName: ptr.To(s.cluster.Name), KubernetesVersion: ptr.To(s.owner.version())}
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
// the spec brings its own, a bootstrap token for this config. The token is
// only made here, not created: the reconciler creates it in the workload
// cluster once the data has rendered (issueToken).
func (r *Reconciler) discovery(ctx context.Context, s *scope, in *render.Input) (*wait, error) {
	join := &in.Spec.JoinConfiguration
	if join.Discovery.File.IsDefined() {
		return r.discoveryFile(ctx, s, in)
	}
	bt := &join.Discovery.BootstrapToken
	if bt.APIServerEndpoint == "" {
		if !s.cluster.Spec.ControlPlaneEndpoint.IsValid() {
			return &wait{ReasonWaitingForControlPlaneEndpoint, "waiting for the Cluster's spec.controlPlaneEndpoint"}, nil
		}
		bt.APIServerEndpoint = s.cluster.Spec.ControlPlaneEndpoint.String()
	}
	if len(bt.CACertHashes) == 0 && !ptr.Deref(bt.UnsafeSkipCAVerification, false) {
		hash, err := r.clusterCAHash(ctx, s)
		if err != nil || hash == "" {
			return &wait{ReasonWaitingForClusterCA, "waiting for the cluster CA Secret " + secret.Name(s.cluster.Name, secret.ClusterCA)}, err
		}
		bt.CACertHashes = []string{hash}
	}
	if bt.Token != "" {
		return nil, nil
	}
	p, err := newToken(s.config, s.rotation, r.clock.Now().Add(r.tokenTTL))
	if err != nil {
		return nil, fmt.Errorf("making the %s's bootstrap token: %w", s.owner.kind(), err)
	}
	bt.Token = p.token
	s.token = p
	return nil, nil
}

// clusterCAHash is the discovery token CA cert hash of the cluster CA:
// from the "<cluster>-ca" Secret, else (attested clusters, whose CA is made
// on the first node) from the workload cluster's kube-public/cluster-info.
// It is "" when neither exists.
func (r *Reconciler) clusterCAHash(ctx context.Context, s *scope) (string, error) {
	caPEM, err := r.clusterCACert(ctx, s)
	if err != nil || caPEM != nil {
		if err != nil {
			return "", err
		}
		return kubeadm.DiscoveryTokenCACertHashPEM(caPEM)
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

// clusterCACert is the cluster CA certificate (PEM) of the "<cluster>-ca"
// Secret, or nil when there is no such Secret.
func (r *Reconciler) clusterCACert(ctx context.Context, s *scope) ([]byte, error) {
	ca, err := secret.GetFromNamespacedName(ctx, fallbackReader{cached: r.client, direct: r.apiReader}, s.clusterKey(), secret.ClusterCA)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the cluster CA Secret: %w", err)
	}
	if len(ca.Data[secret.TLSCrtDataName]) == 0 {
		return nil, fmt.Errorf("the cluster CA Secret %s has no %s", ca.Name, secret.TLSCrtDataName)
	}
	return ca.Data[secret.TLSCrtDataName], nil
}

func renderFiles(files []cabpkv1.File) []render.File {
	out := make([]render.File, 0, len(files))
	for _, f := range files {
		out = append(out, render.File{Path: f.Path, Content: f.Content, Owner: f.Owner, Permissions: f.Permissions})
	}
	return out
}

// ensureFinalizer adds the cleanup finalizer (and marks a managed token)
// before anything outside the config's Secret is created: the patch
// helper writes it at once, and starts over from what is now written.
func (r *Reconciler) ensureFinalizer(ctx context.Context, s *scope, managedToken bool) error {
	config := s.config
	if controllerutil.ContainsFinalizer(config, finalizer) && (!managedToken || config.Annotations[annotationManagedToken] == "true") {
		return nil
	}
	controllerutil.AddFinalizer(config, finalizer)
	if managedToken {
		if config.Annotations == nil {
			config.Annotations = map[string]string{}
		}
		config.Annotations[annotationManagedToken] = "true"
	}
	if err := s.patch.Patch(ctx, config); err != nil {
		return fmt.Errorf("adding the cleanup finalizer: %w", err)
	}
	helper, err := patch.NewHelper(config, r.client)
	if err != nil {
		return fmt.Errorf("preparing the status patch: %w", err)
	}
	s.patch = helper
	return nil
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
