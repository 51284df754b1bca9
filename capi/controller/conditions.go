package controller

// The conditions of a KubeadmConfig, set with Cluster API's conditions
// utilities and written by its patch helper at the end of each reconcile
// (patchStatus).

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
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

// setCertificates records whether the cluster CAs the data needs exist.
func setCertificates(config *bootstrapv1.KubeadmConfig, ok bool, reason, message string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	setCondition(config, ConditionCertificatesAvailable, status, reason, message)
}
