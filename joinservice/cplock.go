package joinservice

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// ControlPlaneLeaseName names the Lease serialising control-plane joins.
const ControlPlaneLeaseName = "gatehouse-control-plane-join"

// ControlPlaneJoinTimeout is how long one control-plane join holds the lock
// unless its node shows up as a control plane earlier: long enough for
// kubeadm join --control-plane to add the etcd member and start the static
// Pods, short enough that a node dying mid-join does not block others long.
const ControlPlaneJoinTimeout = 10 * time.Minute

// controlPlaneBusyRetry is the retry delay a control plane refused with
// errControlPlaneBusy is told to wait (a google.rpc.RetryInfo detail): a
// control-plane join takes a minute or so, and the next one should start
// soon after, not after a backoff grown through the wait.
const controlPlaneBusyRetry = 3 * time.Second

// labelControlPlane is the label kubeadm puts on control-plane Nodes once
// `kubeadm join --control-plane` has added the etcd member
// (mark-control-plane phase).
const labelControlPlane = "node-role.kubernetes.io/control-plane"

// errControlPlaneBusy means another control plane is joining; retry later.
var errControlPlaneBusy = errors.New("another control plane is joining")

// annotationHolderIdentity records on the Lease the attestation identity
// of the node holding it, so only that identity can resume it.
const annotationHolderIdentity = "gatehouse.dev/holder-identity"

// ControlPlaneLock serialises control-plane joins with a coordination Lease
// in the join service's namespace, so that etcd member additions never
// race. Only an attested control plane takes it (the server checks the
// role first). The holder is the joining node's name and attestation
// identity; the lock is free when nobody holds it, when the holder's lease
// ran out, or when the holder's Node is labelled as a control plane (its
// join has passed etcd). The same node with the same identity may take it
// again, so a node retrying its own join resumes it.
type ControlPlaneLock struct {
	client    kubernetes.Interface
	namespace string
	timeout   time.Duration
	now       func() time.Time
}

// NewControlPlaneLock returns the lock, a Lease in namespace; timeout is
// how long a holder keeps it (ControlPlaneJoinTimeout in production).
func NewControlPlaneLock(client kubernetes.Interface, namespace string, timeout time.Duration, now func() time.Time) *ControlPlaneLock {
	return &ControlPlaneLock{client: client, namespace: namespace, timeout: timeout, now: now}
}

// busyError says who holds the lock and until when.
type busyError struct {
	Holder string
	Until  time.Time
}

func (e *busyError) Error() string {
	return fmt.Sprintf("%v: node %s holds the control-plane join lock until %s or until it joins; retry then",
		errControlPlaneBusy, e.Holder, e.Until.UTC().Format(time.RFC3339))
}

func (e *busyError) Unwrap() error { return errControlPlaneBusy }

// Acquire takes the lock for node, attested as identity. It returns a release function that
// frees the lock if this call took it (to undo a join that failed before its
// ticket was complete), a *busyError while another node holds it, or an API
// error. Updates use the Lease's resourceVersion, so two service replicas
// racing for it cannot both win.
func (l *ControlPlaneLock) Acquire(ctx context.Context, node, identity string) (release func(context.Context) error, err error) {
	leases := l.client.CoordinationV1().Leases(l.namespace)
	now := metav1.NewMicroTime(l.now())
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(node),
		LeaseDurationSeconds: ptr.To(int32(l.timeout / time.Second)),
		AcquireTime:          &now,
		RenewTime:            &now,
	}
	lease, err := leases.Get(ctx, ControlPlaneLeaseName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: ControlPlaneLeaseName, Namespace: l.namespace,
				Annotations: map[string]string{annotationHolderIdentity: identity}},
			Spec: spec,
		}
		created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil, &busyError{Holder: "(another replica's choice)", Until: l.now().Add(l.timeout)}
		}
		if err != nil {
			return nil, fmt.Errorf("creating control-plane join Lease: %w", err)
		}
		return l.releaser(created), nil
	case err != nil:
		return nil, fmt.Errorf("reading control-plane join Lease: %w", err)
	}
	if free, err := l.free(ctx, lease, node, identity); err != nil {
		return nil, err
	} else if !free {
		return nil, &busyError{Holder: ptr.Deref(lease.Spec.HolderIdentity, ""), Until: leaseEnd(lease)}
	}
	lease.Spec = spec
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[annotationHolderIdentity] = identity
	updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil, &busyError{Holder: "(another replica's choice)", Until: l.now().Add(l.timeout)}
	}
	if err != nil {
		return nil, fmt.Errorf("taking control-plane join Lease: %w", err)
	}
	return l.releaser(updated), nil
}

func leaseEnd(lease *coordinationv1.Lease) time.Time {
	if lease.Spec.RenewTime == nil {
		return time.Time{}
	}
	return lease.Spec.RenewTime.Add(time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0)) * time.Second)
}

// free reports whether node, attested as identity, may take the lease.
func (l *ControlPlaneLock) free(ctx context.Context, lease *coordinationv1.Lease, node, identity string) (bool, error) {
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	sameHolder := holder == node && lease.Annotations[annotationHolderIdentity] == identity
	if holder == "" || sameHolder || !l.now().Before(leaseEnd(lease)) {
		return true, nil
	}
	n, err := l.client.CoreV1().Nodes().Get(ctx, holder, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading Node %s of the control-plane join Lease: %w", holder, err)
	}
	_, joined := n.Labels[labelControlPlane]
	return joined, nil
}

// releaser returns a function that clears the holder of lease if it is
// still the version this call wrote.
func (l *ControlPlaneLock) releaser(lease *coordinationv1.Lease) func(context.Context) error {
	return func(ctx context.Context) error {
		lease = lease.DeepCopy()
		lease.Spec.HolderIdentity = nil
		lease.Spec.RenewTime = nil
		lease.Spec.AcquireTime = nil
		delete(lease.Annotations, annotationHolderIdentity)
		_, err := l.client.CoordinationV1().Leases(l.namespace).Update(ctx, lease, metav1.UpdateOptions{})
		if err != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("releasing control-plane join Lease: %w", err)
		}
		return nil
	}
}
