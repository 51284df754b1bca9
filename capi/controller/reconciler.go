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
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/locking"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/basetemplate"
	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
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
	templates basetemplate.Source
	mirror    *mirror.Mirror
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
	// Templates gives each Kubernetes version's base template (the
	// components a Machine downloads): a template directory or bucket
	// (package basetemplate); nil means the versions table through
	// Mirror.
	Templates basetemplate.Source
	// Mirror, when set, is where Machines download the versions table's
	// components and kubeadm pulls the control plane's images
	// (docs/install-airgapped.md).
	Mirror *mirror.Mirror
}

// New returns a Reconciler.
func New(o Config) *Reconciler {
	r := &Reconciler{client: o.Client, apiReader: o.APIReader, workload: o.Workload, initLock: o.InitLock,
		clock: o.Clock, tokenTTL: o.TokenTTL, stores: o.Stores, templates: o.Templates, mirror: o.Mirror}
	if r.templates == nil {
		r.templates = basetemplate.Table{Mirror: o.Mirror}
	}
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
// patch helper (patchStatus, conditions.go); status.observedGeneration
// only when the reconcile succeeded. Its branches:
//   - a config being deleted: reconcileDelete (delete.go);
//   - no owner yet, or a paused Cluster or config: only a condition;
//   - a config with data already: reconcileIssued (issued.go) keeps it
//     usable (token, presigned URL);
//   - otherwise, once the Cluster is ready for it: reconcileData renders
//     and stores the init or join data, then continues as issued.
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
