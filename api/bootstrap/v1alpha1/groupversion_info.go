// Package v1alpha1 is the API of Gatehouse's Cluster API bootstrap provider
// (group bootstrap.gatehouse.dev): KubeadmConfig and KubeadmConfigTemplate,
// field-compatible with upstream CABPK's spec, plus Ignition v3 output,
// object storage for the data, and an attested, secret-free mode.
//
// +kubebuilder:object:generate=true
// +groupName=bootstrap.gatehouse.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API's group and version.
	GroupVersion  = schema.GroupVersion{Group: "bootstrap.gatehouse.dev", Version: "v1alpha1"}
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types to a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &KubeadmConfig{}, &KubeadmConfigList{}, &KubeadmConfigTemplate{}, &KubeadmConfigTemplateList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
