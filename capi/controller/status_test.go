package controller_test

import (
	"context"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
)

// brokenWorkload fails every workload cluster client, as an unreachable
// workload API server does.
type brokenWorkload struct{}

func (brokenWorkload) ClientFor(context.Context, client.ObjectKey) (client.Client, error) {
	return nil, errors.New("workload cluster unreachable")
}

func condition(c *bootstrapv1.KubeadmConfig, typ string) *metav1.Condition {
	return meta.FindStatusCondition(c.Status.Conditions, typ)
}

// TestReadySummarisesCertificates: a control-plane join whose cluster CA
// Secrets are missing has CertificatesAvailable=False, and Ready (the
// summary) says so with that condition's reason.
func TestReadySummarisesCertificates(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", true) // initialised, but no CA Secrets
	_, cfg, err := e.Machine(t.Context(), cluster, "cp-1", true, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig})
	if err != nil {
		t.Fatal(err)
	}
	r := e.reconciler(controller.Config{})
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	certs, ready := condition(cfg, controller.ConditionCertificatesAvailable), condition(cfg, controller.ConditionReady)
	if certs == nil || certs.Status != metav1.ConditionFalse {
		t.Fatalf("CertificatesAvailable = %+v, want False", certs)
	}
	if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != controller.ReasonWaitingForClusterCA {
		t.Fatalf("Ready = %+v, want False with reason %s", ready, controller.ReasonWaitingForClusterCA)
	}
	if cfg.Status.ObservedGeneration != cfg.Generation {
		t.Errorf("observedGeneration %d after a successful reconcile, want %d", cfg.Status.ObservedGeneration, cfg.Generation)
	}
}

// TestPausedCondition: a config of a paused Cluster gets Paused=True and
// no data; unpaused, Paused=False and its data.
func TestPausedCondition(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	cluster.Spec.Paused = ptr.To(true)
	if err := e.Client.Update(t.Context(), cluster); err != nil {
		t.Fatal(err)
	}
	_, cfg, err := e.Machine(t.Context(), cluster, "worker", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig})
	if err != nil {
		t.Fatal(err)
	}
	r := e.reconciler(controller.Config{})
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	if p := condition(cfg, clusterv1.PausedCondition); p == nil || p.Status != metav1.ConditionTrue {
		t.Fatalf("Paused = %+v, want True", p)
	}
	if cfg.Status.DataSecretName != nil {
		t.Fatal("a paused config got data")
	}

	if err := e.Client.Get(t.Context(), client.ObjectKeyFromObject(cluster), cluster); err != nil {
		t.Fatal(err)
	}
	cluster.Spec.Paused = ptr.To(false)
	if err := e.Client.Update(t.Context(), cluster); err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	if p := condition(cfg, clusterv1.PausedCondition); p == nil || p.Status != metav1.ConditionFalse {
		t.Fatalf("Paused = %+v after unpausing, want False", p)
	}
	if cfg.Status.DataSecretName == nil {
		t.Fatalf("no data after unpausing; conditions %+v", cfg.Status.Conditions)
	}
}

// TestObservedGenerationOnlyOnSuccess: a reconcile that fails (the
// workload cluster is unreachable, so no bootstrap token) writes its
// conditions but not status.observedGeneration.
func TestObservedGenerationOnlyOnSuccess(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	_, cfg, err := e.Machine(t.Context(), cluster, "worker", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig})
	if err != nil {
		t.Fatal(err)
	}
	r := controller.New(controller.Config{Client: e.Client, APIReader: e.Client, LockClient: e.Client, Workload: brokenWorkload{}})
	if err := e.reconcileOnce(t, r, cfg); err == nil {
		t.Fatal("Reconcile with an unreachable workload cluster succeeded")
	}
	if cfg.Status.ObservedGeneration != 0 {
		t.Fatalf("observedGeneration %d after a failed reconcile, want 0", cfg.Status.ObservedGeneration)
	}
	if condition(cfg, controller.ConditionReady) == nil {
		t.Fatal("a failed reconcile wrote no Ready condition")
	}
	if cfg.Status.DataSecretName != nil {
		t.Fatal("a failed reconcile made data")
	}
}
