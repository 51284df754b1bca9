package controller

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
)

// owner is what a KubeadmConfig bootstraps, as CABPK's ConfigOwner: a
// Machine, or a MachinePool whose instances all boot from the config's
// one data Secret. Exactly one of the two is set.
type owner struct {
	machine *clusterv1.Machine
	pool    *clusterv1.MachinePool
}

const (
	kindMachine     = "Machine"
	kindMachinePool = "MachinePool"
)

// object is the owner; nil when the config has none.
func (o owner) object() client.Object {
	switch {
	case o.pool != nil:
		return o.pool
	case o.machine != nil:
		return o.machine
	}
	return nil
}

func (o owner) kind() string {
	if o.pool != nil {
		return kindMachinePool
	}
	return kindMachine
}

func (o owner) name() string { return o.object().GetName() }

func (o owner) clusterName() string {
	if o.pool != nil {
		return o.pool.Spec.ClusterName
	}
	return o.machine.Spec.ClusterName
}

// version is the Kubernetes version the owner's nodes run, and versionField
// the field it comes from.
func (o owner) version() string {
	if o.pool != nil {
		return o.pool.Spec.Template.Spec.Version
	}
	return o.machine.Spec.Version
}

func (o owner) versionField() string {
	if o.pool != nil {
		return "spec.template.spec.version"
	}
	return "spec.version"
}

// controlPlane: a control-plane Machine. A MachinePool never is one, as in
// CABPK (its configs get a worker's join), whatever its labels.
func (o owner) controlPlane() bool {
	if o.machine == nil {
		return false
	}
	_, ok := o.machine.Labels[clusterv1.MachineControlPlaneLabel]
	return ok
}

// joined is CABPK's HasNodeRefs: a Machine's node has joined; every one of
// a MachinePool's replicas (spec.replicas, 1 when unset) has a node.
func (o owner) joined() bool {
	if o.pool != nil {
		return len(o.pool.Status.NodeRefs) == int(ptr.Deref(o.pool.Spec.Replicas, 1))
	}
	return o.machine.Status.NodeRef.IsDefined()
}

// ownerOf returns the config's owner Machine or MachinePool; gone is true
// when the config names an owner that no longer exists. An owner of any
// version of cluster.x-k8s.io counts (older owners wrote v1beta1).
func (r *Reconciler) ownerOf(ctx context.Context, config *bootstrapv1.KubeadmConfig) (o owner, gone bool, err error) {
	for _, ref := range config.OwnerReferences {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil || gv.Group != clusterv1.GroupVersion.Group {
			continue
		}
		var obj client.Object
		switch ref.Kind {
		case kindMachine:
			o.machine = &clusterv1.Machine{}
			obj = o.machine
		case kindMachinePool:
			o.pool = &clusterv1.MachinePool{}
			obj = o.pool
		default:
			continue
		}
		key := client.ObjectKey{Namespace: config.Namespace, Name: ref.Name}
		if err := r.client.Get(ctx, key, obj); err != nil {
			if !apierrors.IsNotFound(err) {
				return owner{}, false, fmt.Errorf("reading %s %s: %w", ref.Kind, ref.Name, err)
			}
			// The cache may lag behind a new owner: ask the API server.
			if err := r.apiReader.Get(ctx, key, obj); err != nil {
				if apierrors.IsNotFound(err) {
					return owner{}, true, nil
				}
				return owner{}, false, fmt.Errorf("reading %s %s: %w", ref.Kind, ref.Name, err)
			}
		}
		if obj.GetUID() != ref.UID {
			return owner{}, true, nil
		}
		return o, false, nil
	}
	return owner{}, false, nil
}

// machineToConfig and machinePoolToConfig map an owner to the
// KubeadmConfig its bootstrap.configRef names.
func machineToConfig(_ context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return nil
	}
	return configRequest(m.Namespace, m.Spec.Bootstrap.ConfigRef)
}

func machinePoolToConfig(_ context.Context, o client.Object) []reconcile.Request {
	mp, ok := o.(*clusterv1.MachinePool)
	if !ok {
		return nil
	}
	return configRequest(mp.Namespace, mp.Spec.Template.Spec.Bootstrap.ConfigRef)
}

func configRequest(namespace string, ref clusterv1.ContractVersionedObjectReference) []reconcile.Request {
	if ref.Kind != "KubeadmConfig" || ref.APIGroup != bootstrapv1.GroupVersion.Group || ref.Name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: namespace, Name: ref.Name}}}
}
