package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
)

// Format is the bootstrap data's format.
// +kubebuilder:validation:Enum=cloud-config;ignition
type Format string

const (
	// FormatCloudConfig is cloud-init's #cloud-config.
	FormatCloudConfig Format = "cloud-config"
	// FormatIgnition is Ignition v3 JSON.
	FormatIgnition Format = "ignition"
)

// KubeadmConfigSpec is CABPK's KubeadmConfigSpec (same field names and
// types) plus Format, Ignition, UserDataStore and Attested.
//
// +kubebuilder:validation:XValidation:rule="!has(self.ignition) || self.format == 'ignition'",message="ignition is set but format is not ignition"
// +kubebuilder:validation:XValidation:rule="!has(self.userDataStore) || !has(self.userDataStore.stub) || self.userDataStore.stub != 's3-uri' || self.format == 'ignition'",message="an s3-uri stub needs format ignition: cloud-init cannot fetch s3:// user data; use presigned-url"
// +kubebuilder:validation:XValidation:rule="!(has(self.attested) && self.attested.enabled) || !has(self.files) || self.files.all(f, !has(f.contentFrom))",message="attested mode carries no secrets: files must not use contentFrom"
// +kubebuilder:validation:XValidation:rule="!(has(self.attested) && self.attested.enabled) || !has(self.joinConfiguration) || !has(self.joinConfiguration.discovery) || !has(self.joinConfiguration.discovery.bootstrapToken) || !has(self.joinConfiguration.discovery.bootstrapToken.token) || size(self.joinConfiguration.discovery.bootstrapToken.token) == 0",message="attested mode carries no bootstrap token: the join service issues one to the attested machine"
type KubeadmConfigSpec struct {
	// ClusterConfiguration is kubeadm's ClusterConfiguration.
	// +optional
	ClusterConfiguration cabpkv1.ClusterConfiguration `json:"clusterConfiguration,omitempty,omitzero"`
	// InitConfiguration is kubeadm's InitConfiguration.
	// +optional
	InitConfiguration cabpkv1.InitConfiguration `json:"initConfiguration,omitempty,omitzero"`
	// JoinConfiguration is kubeadm's JoinConfiguration.
	// +optional
	JoinConfiguration cabpkv1.JoinConfiguration `json:"joinConfiguration,omitempty,omitzero"`
	// Files to write, inline or from Secrets (contentFrom).
	// +optional
	// +kubebuilder:validation:MaxItems=200
	Files []cabpkv1.File `json:"files,omitempty"`
	// DiskSetup partitions disks and creates file systems.
	// +optional
	DiskSetup cabpkv1.DiskSetup `json:"diskSetup,omitempty,omitzero"`
	// Mounts are mount points.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	Mounts []cabpkv1.MountPoints `json:"mounts,omitempty"`
	// BootCommands run early on every boot.
	// +optional
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=10240
	BootCommands []string `json:"bootCommands,omitempty"`
	// PreKubeadmCommands run before kubeadm.
	// +optional
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=10240
	PreKubeadmCommands []string `json:"preKubeadmCommands,omitempty"`
	// PostKubeadmCommands run after kubeadm.
	// +optional
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=10240
	PostKubeadmCommands []string `json:"postKubeadmCommands,omitempty"`
	// Users to create.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	Users []cabpkv1.User `json:"users,omitempty"`
	// NTP configures time servers.
	// +optional
	NTP cabpkv1.NTP `json:"ntp,omitempty,omitzero"`
	// Verbosity is kubeadm's --v.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Verbosity *int32 `json:"verbosity,omitempty"`
	// Format of the bootstrap data.
	// +optional
	// +kubebuilder:default=cloud-config
	Format Format `json:"format,omitempty"`
	// Ignition configures Ignition output (format ignition).
	// +optional
	Ignition *IgnitionSpec `json:"ignition,omitempty"`
	// UserDataStore, when set, keeps the full data in an S3-compatible
	// bucket; the data Secret then holds only a stub pointing at it.
	// +optional
	UserDataStore *UserDataStore `json:"userDataStore,omitempty"`
	// MaxUserDataSize is the most bootstrap data, raw, that the Machine's
	// infrastructure takes as user data: larger data gets the
	// UserDataTooLarge condition, naming the fix, instead of a Secret.
	// Unset means 16Ki, the smallest common cloud limit. With
	// UserDataStore it applies to the stub. The data Secret's own limit
	// (1Mi) applies regardless.
	// +optional
	MaxUserDataSize *resource.Quantity `json:"maxUserDataSize,omitempty"`
	// Architecture of the Machine's CPU; it picks the pinned binaries.
	// +optional
	// +kubebuilder:default=amd64
	// +kubebuilder:validation:Enum=amd64;arm64
	Architecture string `json:"architecture,omitempty"`
	// Attested makes the data secret-free: it only configures the machine's
	// gatehouse-bootstrapper to join through the join service, which hands
	// the attested machine its token, keys and certificates.
	// +optional
	Attested *AttestedSpec `json:"attested,omitempty"`
}

// IgnitionSpec configures Ignition v3 output.
type IgnitionSpec struct {
	// AdditionalConfig is Butane YAML merged into the rendered config.
	// +optional
	// +kubebuilder:validation:MaxLength=32768
	AdditionalConfig string `json:"additionalConfig,omitempty"`
	// ContainerLinuxConfig is CABPK's field for Container Linux Config
	// additions, which become Ignition v2. It is accepted so that CABPK's
	// specs decode, and refused with the InvalidSpec condition, whose
	// message says how to write it as Butane in AdditionalConfig.
	// +optional
	ContainerLinuxConfig cabpkv1.ContainerLinuxConfig `json:"containerLinuxConfig,omitempty,omitzero"`
}

// UserDataStore is an S3-compatible bucket.
type UserDataStore struct {
	// Endpoint is the S3 endpoint, host[:port].
	// +kubebuilder:validation:MinLength=1
	Endpoint string `json:"endpoint"`
	// Bucket is the bucket name.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket"`
	// Region of the bucket.
	// +optional
	Region string `json:"region,omitempty"`
	// CredentialsSecret names a Secret in the KubeadmConfig's namespace
	// with accessKeyID and secretAccessKey, and optionally ca.crt (PEM) to
	// trust for the endpoint's TLS certificate.
	// +kubebuilder:validation:MinLength=1
	CredentialsSecret string `json:"credentialsSecret"`
	// Stub is how the data Secret points at the object: presigned-url
	// (an HTTPS URL valid for PresignedURLTTL) or s3-uri.
	// +optional
	// +kubebuilder:default=presigned-url
	// +kubebuilder:validation:Enum=presigned-url;s3-uri
	Stub string `json:"stub,omitempty"`
	// PresignedURLTTL is how long a presigned-url stub stays valid: a
	// Machine must boot within it; a MachinePool's URL is renewed once less
	// than half of it is left. At most 168h (S3 signature v4 limit).
	// +optional
	// +kubebuilder:default="24h"
	PresignedURLTTL *metav1.Duration `json:"presignedURLTTL,omitempty"`
	// ServerSideEncryption asks the bucket to encrypt the object.
	// +optional
	// +kubebuilder:default=true
	ServerSideEncryption *bool `json:"serverSideEncryption,omitempty"`
}

// AttestedSpec configures the secret-free mode.
type AttestedSpec struct {
	// Enabled turns attested mode on.
	Enabled bool `json:"enabled"`
	// JoinEndpoints are the join service's host:port endpoints.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	JoinEndpoints []string `json:"joinEndpoints,omitempty"`
}

// KubeadmConfigStatus follows the Cluster API bootstrap contract.
type KubeadmConfigStatus struct {
	// Initialization reports the contract's provisioning milestones.
	// +optional
	Initialization *Initialization `json:"initialization,omitempty"`
	// DataSecretName names the Secret holding the bootstrap data.
	// +optional
	DataSecretName *string `json:"dataSecretName,omitempty"`
	// Conditions are the provider's conditions.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the last generation reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Initialization holds the contract's dataSecretCreated.
type Initialization struct {
	// DataSecretCreated is true once the data Secret exists.
	// +optional
	DataSecretCreated *bool `json:"dataSecretCreated,omitempty"`
}

// KubeadmConfig is the bootstrap configuration of one Machine.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=kubeadmconfigs,scope=Namespaced,categories=cluster-api
// +kubebuilder:printcolumn:name="Format",type=string,JSONPath=`.spec.format`
// +kubebuilder:printcolumn:name="Data Secret",type=string,JSONPath=`.status.dataSecretName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type KubeadmConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   KubeadmConfigSpec   `json:"spec,omitempty"`
	Status KubeadmConfigStatus `json:"status,omitempty"`
}

// GetConditions returns the config's conditions (Cluster API's
// conditions.Getter, for its conditions and patch utilities).
func (c *KubeadmConfig) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions sets the config's conditions (conditions.Setter).
func (c *KubeadmConfig) SetConditions(conditions []metav1.Condition) {
	c.Status.Conditions = conditions
}

// KubeadmConfigList is a list of KubeadmConfig.
//
// +kubebuilder:object:root=true
type KubeadmConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KubeadmConfig `json:"items"`
}

// KubeadmConfigTemplateResource is the template's content.
type KubeadmConfigTemplateResource struct {
	// Spec of the KubeadmConfigs made from the template.
	Spec KubeadmConfigSpec `json:"spec,omitempty"`
}

// KubeadmConfigTemplateSpec holds the template.
type KubeadmConfigTemplateSpec struct {
	Template KubeadmConfigTemplateResource `json:"template"`
}

// KubeadmConfigTemplate is a template for KubeadmConfigs (used by
// MachineDeployments and control-plane providers).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=kubeadmconfigtemplates,scope=Namespaced,categories=cluster-api
type KubeadmConfigTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec KubeadmConfigTemplateSpec `json:"spec,omitempty"`
}

// KubeadmConfigTemplateList is a list of KubeadmConfigTemplate.
//
// +kubebuilder:object:root=true
type KubeadmConfigTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KubeadmConfigTemplate `json:"items"`
}
