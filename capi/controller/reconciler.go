// Package controller is the Cluster API bootstrap provider's controller: it
// turns each KubeadmConfig (bootstrap.gatehouse.dev) into the bootstrap data
// Secret of its Machine or MachinePool, following the Cluster API bootstrap
// provider contract (cluster-api.sigs.k8s.io, "Contract rules for
// BootstrapConfig") and CABPK's orchestration:
//
//   - nothing is rendered before the Cluster's infrastructure is
//     provisioned (status.initialization.infrastructureProvisioned);
//   - the first control-plane Machine gets `kubeadm init` under the
//     "<cluster>-lock" ConfigMap lock (CABPK's, so the two never both
//     init one cluster); every other Machine waits until the control
//     plane is initialised (status.initialization.controlPlaneInitialized);
//   - defaults come from the Cluster and Machine: control-plane endpoint,
//     cluster name, service domain, pod and service CIDRs, Kubernetes
//     version, and for joins the bootstrap token and discovery token CA
//     cert hash;
//   - the cluster CAs are taken from the "<cluster>-ca|etcd|proxy|sa"
//     Secrets or generated (Cluster API's certificate conventions);
//   - joining Machines get a bootstrap token in the workload cluster,
//     extended until their node has joined and deleted after;
//   - a MachinePool's config always renders a worker's join, whose token
//     is kept valid for as long as the pool exists (any instance may boot
//     from it at any time): extended while the pool scales, and rotated
//     (a new token, the data Secret rewritten) once it is gone, or nearly
//     expired once every replica has joined;
//   - the data goes into a Secret named after the config (type
//     cluster.x-k8s.io/secret, keys "value" and "format"), named in
//     status.dataSecretName with status.initialization.dataSecretCreated,
//     or, with userDataStore, into a bucket with only a stub in the Secret;
//     a MachinePool's presigned URL stub is renewed (a new URL for the same
//     object) before it expires, for as long as the pool exists.
//
// In attested mode the data holds no secret at all: no CA, no token.
package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/locking"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
)

// Conditions of a KubeadmConfig (metav1.Condition types and reasons).
const (
	// ConditionReady summarises the others (Cluster API's summary
	// condition): False while any is False, with the first one's reason.
	ConditionReady = "Ready"
	// ConditionDataSecretAvailable: the data Secret exists.
	ConditionDataSecretAvailable = "DataSecretAvailable"
	// ConditionCertificatesAvailable: the cluster CAs the data needs exist.
	ConditionCertificatesAvailable = "CertificatesAvailable"

	ReasonDataSecretAvailable            = "DataSecretAvailable"
	ReasonWaitingForOwner                = "WaitingForOwnerMachine"
	ReasonWaitingForInfrastructure       = "WaitingForClusterInfrastructure"
	ReasonWaitingForControlPlane         = "WaitingForControlPlaneInitialization"
	ReasonWaitingForInitLock             = "WaitingForInitLock"
	ReasonWaitingForClusterCA            = "WaitingForClusterCA"
	ReasonWaitingForControlPlaneEndpoint = "WaitingForControlPlaneEndpoint"
	ReasonNoBaseTemplate                 = "NoBaseTemplateForVersion"
	ReasonInvalidSpec                    = "InvalidSpec"
	ReasonRenderFailed                   = "RenderFailed"
	ReasonBootstrapTokenExpired          = "BootstrapTokenExpired"
	ReasonCertificatesAvailable          = "CertificatesAvailable"
	ReasonCertificatesGenerationFailed   = "CertificatesGenerationFailed"
	ReasonUserDataStoreFailed            = "UserDataStoreFailed"
	ReasonUserDataTooLarge               = "UserDataTooLarge"
)

// finalizer is set on KubeadmConfigs that own something outside their own
// Secret (a bootstrap token in the workload cluster, an object in a bucket).
const finalizer = "bootstrap.gatehouse.dev/cleanup"

// waitRequeue is how often a config waiting on something that no watch
// reports (the init lock's holder, a missing CA) is looked at again.
const waitRequeue = 20 * time.Second

// WorkloadClients gives clients of workload clusters.
type WorkloadClients interface {
	ClientFor(ctx context.Context, cluster client.ObjectKey) (client.Client, error)
}

// InitLock serialises `kubeadm init` per cluster.
type InitLock interface {
	Lock(ctx context.Context, cluster *clusterv1.Cluster, machine *clusterv1.Machine) bool
	Unlock(ctx context.Context, cluster *clusterv1.Cluster) bool
}

// Reconciler reconciles KubeadmConfigs. Build it with New.
type Reconciler struct {
	client    client.Client
	apiReader client.Reader
	workload  WorkloadClients
	initLock  InitLock
	clock     clock.PassiveClock
	tokenTTL  time.Duration
	stores    StoreFactory
	// tokenChecks remembers, per config UID, when its token next needs
	// looking at, so reconciles in between cost the workload cluster nothing.
	tokenChecks sync.Map
}

// Config holds the Reconciler's dependencies (Client, APIReader and
// Workload are required) and its optional settings.
type Config struct {
	// Client is the manager's (cached) client.
	Client client.Client
	// APIReader reads what is not cached: user Secrets (contentFrom,
	// bucket credentials) and Machines when deciding one is gone.
	APIReader client.Reader
	// Workload gives workload cluster clients (bootstrap tokens).
	Workload WorkloadClients
	// InitLock; nil means CABPK's ConfigMap lock through LockClient.
	InitLock InitLock
	// LockClient is an uncached client for the init lock's ConfigMaps.
	LockClient client.Client
	// Clock; nil means the real clock.
	Clock clock.PassiveClock
	// TokenTTL; zero means DefaultTokenTTL.
	TokenTTL time.Duration
	// Stores opens userDataStore buckets; nil means S3 (userdatastore).
	Stores StoreFactory
}

// New returns a Reconciler.
func New(o Config) *Reconciler {
	r := &Reconciler{client: o.Client, apiReader: o.APIReader, workload: o.Workload, initLock: o.InitLock,
		clock: o.Clock, tokenTTL: o.TokenTTL, stores: o.Stores}
	if r.initLock == nil {
		r.initLock = locking.NewControlPlaneInitMutex(o.LockClient)
	}
	if r.clock == nil {
		r.clock = clock.RealClock{}
	}
	if r.tokenTTL == 0 {
		r.tokenTTL = DefaultTokenTTL
	}
	if r.stores == nil {
		r.stores = s3Stores
	}
	return r
}

// SetupWithManager registers the controller: it watches KubeadmConfigs,
// the Machines and MachinePools that own them and their Clusters.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	return ctrl.NewControllerManagedBy(mgr).
		// The controller's own status patches need no reconcile.
		For(&bootstrapv1.KubeadmConfig{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{},
			predicate.AnnotationChangedPredicate{}, predicate.LabelChangedPredicate{}, ownerOrDeletionChanged()))).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(machineToConfig)).
		Watches(&clusterv1.MachinePool{}, handler.EnqueueRequestsFromMapFunc(machinePoolToConfig)).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.clusterToConfigs)).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Named("kubeadmconfig").
		Complete(r)
}

// ownerOrDeletionChanged passes updates that set owners (the Machine or
// MachinePool adopting its config) or start a deletion; neither changes the
// generation.
func ownerOrDeletionChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return !equality.Semantic.DeepEqual(e.ObjectOld.GetOwnerReferences(), e.ObjectNew.GetOwnerReferences()) ||
			e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	}}
}

// clusterToConfigs wakes every config of a Cluster that has no data yet, or
// whose Cluster is being looked at for the first time.
func (r *Reconciler) clusterToConfigs(ctx context.Context, o client.Object) []reconcile.Request {
	var list bootstrapv1.KubeadmConfigList
	if err := r.client.List(ctx, &list, client.InNamespace(o.GetNamespace()),
		client.MatchingLabels{clusterv1.ClusterNameLabel: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the KubeadmConfigs of a Cluster")
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if list.Items[i].Status.DataSecretName == nil {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// scope is what one reconcile works on.
type scope struct {
	config  *bootstrapv1.KubeadmConfig
	owner   owner
	cluster *clusterv1.Cluster
	// patch writes config's changes at the end of the reconcile (Cluster
	// API's patch helper); nil when nothing more is to be written.
	patch *patch.Helper
	// token is the join's bootstrap token when this controller makes it:
	// created in the workload cluster only once the data has rendered.
	token *pendingToken
	// rotation is the number of the token the data is rendered with: 0,
	// or a MachinePool's rotated token (tokenRotation).
	rotation int
}

func (s *scope) clusterKey() client.ObjectKey { return client.ObjectKeyFromObject(s.cluster) }

func (s *scope) attested() bool {
	return s.config.Spec.Attested != nil && s.config.Spec.Attested.Enabled
}

func (s *scope) controlPlane() bool { return s.owner.controlPlane() }

// +kubebuilder:rbac:groups=bootstrap.gatehouse.dev,resources=kubeadmconfigs;kubeadmconfigs/status;kubeadmconfigs/finalizers,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=bootstrap.gatehouse.dev,resources=kubeadmconfigtemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;clusters/status;machines;machines/status;machinepools;machinepools/status,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// The manager's secure /metrics checks its callers with the API server:
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Reconcile brings one KubeadmConfig's data Secret and token up to date.
// Status and conditions are written once, at the end, by Cluster API's
// patch helper; status.observedGeneration only when the reconcile
// succeeded.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (res reconcile.Result, err error) {
	config := &bootstrapv1.KubeadmConfig{}
	if err := r.client.Get(ctx, req.NamespacedName, config); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("KubeadmConfig", klog.KObj(config))
	ctx = ctrl.LoggerInto(ctx, log)
	if !config.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.reconcileDelete(ctx, config)
	}
	s := &scope{config: config}
	if s.patch, err = patch.NewHelper(config, r.client); err != nil {
		return reconcile.Result{}, fmt.Errorf("preparing the status patch: %w", err)
	}
	defer func() {
		if s.patch == nil {
			return // deleted, or paused (the Paused condition is written)
		}
		if patchErr := r.patchStatus(ctx, s, err == nil); patchErr != nil {
			err = errors.Join(err, patchErr)
		}
	}()

	owner, gone, err := r.ownerOf(ctx, config)
	if err != nil {
		return reconcile.Result{}, err
	}
	if gone {
		// The owner is deleted; the garbage collector deletes the config
		// too, but do not wait for it to clean up tokens and objects.
		s.patch = nil
		return reconcile.Result{}, client.IgnoreNotFound(r.client.Delete(ctx, config, client.Preconditions{UID: &config.UID}))
	}
	if owner.object() == nil {
		setWaiting(config, ReasonWaitingForOwner, "waiting for a Machine or MachinePool to own this config")
		return reconcile.Result{}, nil
	}
	cluster := &clusterv1.Cluster{}
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: owner.clusterName()}, cluster); err != nil {
		return reconcile.Result{}, fmt.Errorf("reading Cluster %s: %w", owner.clusterName(), err)
	}
	s.owner, s.cluster = owner, cluster
	log = log.WithValues(owner.kind(), klog.KObj(owner.object()), "Cluster", klog.KObj(cluster))
	ctx = ctrl.LoggerInto(ctx, log)
	if annotations.IsPaused(cluster, config) {
		// Only the Paused condition changes while paused.
		setPaused(config, cluster)
		err := s.patch.Patch(ctx, config, patch.WithOwnedConditions{Conditions: []string{clusterv1.PausedCondition}})
		s.patch = nil
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if config.Status.DataSecretName != nil {
		return r.reconcileIssued(ctx, s)
	}
	if !ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) {
		setWaiting(config, ReasonWaitingForInfrastructure, "waiting for the Cluster's infrastructure to be provisioned")
		return reconcile.Result{}, nil
	}
	if !ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) {
		if !s.controlPlane() {
			setWaiting(config, ReasonWaitingForControlPlane, "waiting for the control plane to be initialised")
			return reconcile.Result{}, nil
		}
		if !r.initLock.Lock(ctx, cluster, owner.machine) {
			setWaiting(config, ReasonWaitingForInitLock, "another control-plane Machine holds the init lock; waiting for the control plane to be initialised")
			return reconcile.Result{RequeueAfter: waitRequeue}, nil
		}
		return r.reconcileData(ctx, s, render.RoleInit)
	}
	if s.controlPlane() {
		// Only a control-plane Machine can hold the lock; workers leave it be.
		r.initLock.Unlock(ctx, cluster)
	}
	return r.reconcileData(ctx, s, render.RoleJoin)
}

// reconcileData renders the data and stores it.
func (r *Reconciler) reconcileData(ctx context.Context, s *scope, role render.Role) (reconcile.Result, error) {
	// A reconcile that ran on a cache older than the last status patch
	// finds its own data Secret: nothing to render again.
	existing := &corev1.Secret{}
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(s.config), existing); err == nil && metav1.IsControlledBy(existing, s.config) {
		s.config.Status.DataSecretName = ptr.To(existing.Name)
		s.config.Status.Initialization = &bootstrapv1.Initialization{DataSecretCreated: ptr.To(true)}
		setDataAvailable(s.config)
		return r.reconcileIssued(ctx, s)
	}
	if ok, res, err := r.writeData(ctx, s, role); !ok {
		return res, err
	}
	return r.reconcileIssued(ctx, s)
}

// writeData renders the data and stores it: the data Secret is created, or
// rewritten when the config has data already (a MachinePool's token
// rotation). ok is false when no data was written; the condition then says
// why, and res and err are the reconcile's.
func (r *Reconciler) writeData(ctx context.Context, s *scope, role render.Role) (ok bool, res reconcile.Result, err error) {
	in, w, err := r.renderInput(ctx, s, role)
	if err != nil {
		var se *specError
		switch {
		case errors.Is(err, render.ErrNoBaseTemplate):
			setWaiting(s.config, ReasonNoBaseTemplate, err.Error())
			return false, reconcile.Result{}, nil
		case errors.As(err, &se):
			setWaiting(s.config, ReasonInvalidSpec, se.Error())
			return false, reconcile.Result{}, nil
		}
		return false, reconcile.Result{}, err
	}
	if w != nil {
		setWaiting(s.config, w.reason, w.message)
		return false, reconcile.Result{RequeueAfter: waitRequeue}, nil
	}
	data, err := render.Render(in)
	if err != nil {
		switch {
		case errors.Is(err, render.ErrNoBaseTemplate):
			setWaiting(s.config, ReasonNoBaseTemplate, err.Error())
		case errors.Is(err, render.ErrContainerLinuxConfig), errors.Is(err, render.ErrAttestedSpec):
			setWaiting(s.config, ReasonInvalidSpec, err.Error())
		default:
			setWaiting(s.config, ReasonRenderFailed, err.Error())
		}
		return false, reconcile.Result{}, nil
	}
	// Only data that renders and fits gets anything made outside the
	// config: its bucket object, its token, and the finalizer that cleans
	// them up. (A token is as long as the placeholder it replaces.)
	var store ObjectStore
	var caPEM []byte
	if s.config.Spec.UserDataStore != nil {
		if store, caPEM, err = r.openStore(ctx, s.config); err != nil {
			res, err := storeFailed(s, err)
			return false, res, err
		}
	} else if err := checkSize(s.config, data, dataFormat(s.config)); err != nil {
		res, err := storeFailed(s, err)
		return false, res, err
	}
	if s.token != nil {
		if data, err = r.issueToken(ctx, s, &in, data); err != nil {
			return false, reconcile.Result{}, err
		}
	} else if store != nil {
		if err := r.ensureFinalizer(ctx, s, false); err != nil {
			return false, reconcile.Result{}, err
		}
	}
	if err := r.storeData(ctx, s, data, store, caPEM); err != nil {
		res, err := storeFailed(s, err)
		return false, res, err
	}
	setDataAvailable(s.config)
	return true, reconcile.Result{}, nil
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

// readyReason is the summary Ready condition's reason: the first issue's
// (DataSecretAvailable before CertificatesAvailable), else the first
// unknown one's, else DataSecretAvailable.
func readyReason(issues, unknown, _ []conditions.ConditionWithOwnerInfo) string {
	switch {
	case len(issues) > 0:
		return issues[0].Reason
	case len(unknown) > 0:
		return unknown[0].Reason
	}
	return ReasonDataSecretAvailable
}

// setPaused sets Cluster API's Paused condition (its reasons and
// messages, as util/paused): True while the Cluster's spec.paused or the
// config's cluster.x-k8s.io/paused annotation is set. It is written with
// the reconcile's other status changes, not by a patch of its own.
func setPaused(config *bootstrapv1.KubeadmConfig, cluster *clusterv1.Cluster) {
	var why []string
	if ptr.Deref(cluster.Spec.Paused, false) {
		why = append(why, "Cluster spec.paused is set to true")
	}
	if annotations.HasPaused(config) {
		why = append(why, "KubeadmConfig has the cluster.x-k8s.io/paused annotation")
	}
	c := metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionFalse, Reason: clusterv1.NotPausedReason}
	if len(why) > 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, clusterv1.PausedReason, strings.Join(why, ", ")
	}
	c.ObservedGeneration = config.Generation
	conditions.Set(config, c)
}

// setReady sets Ready as the summary of the other conditions.
func setReady(config *bootstrapv1.KubeadmConfig) error {
	if meta.FindStatusCondition(config.Status.Conditions, ConditionDataSecretAvailable) == nil {
		setCondition(config, ConditionDataSecretAvailable, metav1.ConditionUnknown, "Reconciling", "")
	}
	if err := conditions.SetSummaryCondition(config, config, ConditionReady,
		conditions.ForConditionTypes{ConditionDataSecretAvailable, ConditionCertificatesAvailable},
		conditions.IgnoreTypesIfMissing{ConditionCertificatesAvailable},
		conditions.CustomMergeStrategy{MergeStrategy: conditions.DefaultMergeStrategy(conditions.ComputeReasonFunc(readyReason))},
	); err != nil {
		return fmt.Errorf("summarising the Ready condition: %w", err)
	}
	return nil
}

// patchStatus sets the summary Ready condition from every other condition
// and, after a successful reconcile, status.observedGeneration, and writes
// the config's changes with the patch helper (owning our conditions).
func (r *Reconciler) patchStatus(ctx context.Context, s *scope, succeeded bool) error {
	config := s.config
	if s.cluster != nil {
		setPaused(config, s.cluster)
	}
	if err := setReady(config); err != nil {
		return err
	}
	for i := range config.Status.Conditions {
		config.Status.Conditions[i].ObservedGeneration = config.Generation
	}
	if succeeded {
		config.Status.ObservedGeneration = config.Generation
	}
	err := s.patch.Patch(ctx, config, patch.WithOwnedConditions{Conditions: []string{
		ConditionReady, ConditionDataSecretAvailable, ConditionCertificatesAvailable, clusterv1.PausedCondition,
	}})
	return client.IgnoreNotFound(err)
}

func setDataAvailable(config *bootstrapv1.KubeadmConfig) {
	setCondition(config, ConditionDataSecretAvailable, metav1.ConditionTrue, ReasonDataSecretAvailable, "data Secret "+config.Name)
}

// setWaiting records that the data is not (or no longer) usable and why
// (Ready follows, as the summary).
func setWaiting(config *bootstrapv1.KubeadmConfig, reason, message string) {
	setCondition(config, ConditionDataSecretAvailable, metav1.ConditionFalse, reason, message)
}

func setCondition(config *bootstrapv1.KubeadmConfig, typ string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&config.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message})
}

// specError is a problem with the user's objects, reported as a condition.
type specError struct{ msg string }

func (e *specError) Error() string { return e.msg }

func specErrorf(format string, args ...any) error {
	return &specError{msg: fmt.Sprintf(format, args...)}
}

// dataStoreError is a failure of the userDataStore bucket: its credentials,
// the upload or the presigned URL. It is reported as the
// UserDataStoreFailed condition and retried after waitRequeue.
type dataStoreError struct{ err error }

func (e *dataStoreError) Error() string { return "userDataStore: " + e.err.Error() }

func (e *dataStoreError) Unwrap() error { return e.err }

func dataStoreErrorf(format string, args ...any) error {
	return &dataStoreError{err: fmt.Errorf(format, args...)}
}
