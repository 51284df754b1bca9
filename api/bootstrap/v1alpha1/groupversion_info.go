// Package v1alpha1 is the API of Gatehouse's Cluster API bootstrap provider
// (group bootstrap.gatehouse.dev): KubeadmConfig and KubeadmConfigTemplate,
// field-compatible with upstream CABPK's spec, plus Ignition v3 output,
// object storage for the data, and an attested, secret-free mode.
//
// +kubebuilder:object:generate=true
// +groupName=bootstrap.gatehouse.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API's group and version.
	GroupVersion = schema.GroupVersion{Group: "bootstrap.gatehouse.dev", Version: "v1alpha1"}
	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
