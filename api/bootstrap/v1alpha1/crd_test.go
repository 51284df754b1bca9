package v1alpha1_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// TestCRDs installs the generated CRDs into a real API server and checks
// defaults and the CEL rules for invalid combinations.
func TestCRDs(t *testing.T) {
	cfg := testenv.NewEnvtest(t, filepath.Join("..", "..", "..", "config", "crd"))
	scheme := runtime.NewScheme()
	if err := bootstrapv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	config := func(name string, spec bootstrapv1.KubeadmConfigSpec) *bootstrapv1.KubeadmConfig {
		return &bootstrapv1.KubeadmConfig{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: spec}
	}

	valid := config("valid", bootstrapv1.KubeadmConfigSpec{
		PreKubeadmCommands: []string{"echo hi"},
		Files:              []cabpkv1.File{{Path: "/etc/x", Content: "x"}},
		UserDataStore:      &bootstrapv1.UserDataStore{Endpoint: "s3.example.com", Bucket: "bootstrap", CredentialsSecret: "s3"},
	})
	if err := c.Create(ctx, valid); err != nil {
		t.Fatalf("a valid KubeadmConfig is refused: %v", err)
	}
	if valid.Spec.Format != bootstrapv1.FormatCloudConfig || valid.Spec.UserDataStore.Stub != "presigned-url" ||
		!ptr.Deref(valid.Spec.UserDataStore.ServerSideEncryption, false) || valid.Spec.Architecture != "amd64" ||
		valid.Spec.UserDataStore.PresignedURLTTL == nil || valid.Spec.UserDataStore.PresignedURLTTL.Duration != 24*time.Hour {
		t.Fatalf("defaults not applied: format %q, stub %q, SSE %v, arch %q, TTL %v", valid.Spec.Format, valid.Spec.UserDataStore.Stub,
			valid.Spec.UserDataStore.ServerSideEncryption, valid.Spec.Architecture, valid.Spec.UserDataStore.PresignedURLTTL)
	}
	attested := config("attested", bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition,
		Ignition: &bootstrapv1.IgnitionSpec{AdditionalConfig: "variant: fcos\nversion: 1.6.0\n"},
		Attested: &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}}})
	if err := c.Create(ctx, attested); err != nil {
		t.Fatalf("a valid attested ignition KubeadmConfig is refused: %v", err)
	}

	for _, tc := range []struct {
		name string
		spec bootstrapv1.KubeadmConfigSpec
		want string
	}{
		{"ignition spec with cloud-config", bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig, Ignition: &bootstrapv1.IgnitionSpec{}}, "format is not ignition"},
		{"attested with secret files", bootstrapv1.KubeadmConfigSpec{Attested: &bootstrapv1.AttestedSpec{Enabled: true},
			Files: []cabpkv1.File{{Path: "/etc/k", ContentFrom: cabpkv1.FileSource{Secret: cabpkv1.SecretFileSource{Name: "s", Key: "k"}}}}}, "must not use contentFrom"},
		{"attested with a token", bootstrapv1.KubeadmConfigSpec{Attested: &bootstrapv1.AttestedSpec{Enabled: true},
			JoinConfiguration: cabpkv1.JoinConfiguration{Discovery: cabpkv1.Discovery{BootstrapToken: cabpkv1.BootstrapTokenDiscovery{Token: "abcdef.0123456789abcdef", APIServerEndpoint: "10.0.0.1:6443", CACertHashes: []string{"sha256:aa"}}}}}, "carries no bootstrap token"},
		{"s3 stub with cloud-config", bootstrapv1.KubeadmConfigSpec{UserDataStore: &bootstrapv1.UserDataStore{Endpoint: "s3", Bucket: "bootstrap", CredentialsSecret: "s", Stub: "s3-uri"}}, "needs format ignition"},
		{"unknown architecture", bootstrapv1.KubeadmConfigSpec{Architecture: "riscv64"}, "supported values"},
		{"unknown format", bootstrapv1.KubeadmConfigSpec{Format: "yaml"}, "supported values"},
		{"bucket too short", bootstrapv1.KubeadmConfigSpec{UserDataStore: &bootstrapv1.UserDataStore{Endpoint: "s3", Bucket: "b", CredentialsSecret: "s"}}, "bucket"},
	} {
		err := c.Create(ctx, config(strings.ReplaceAll(tc.name, " ", "-"), tc.spec))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal containing %q", tc.name, err, tc.want)
		}
	}

	tmpl := &bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: "default"},
		Spec: bootstrapv1.KubeadmConfigTemplateSpec{Template: bootstrapv1.KubeadmConfigTemplateResource{Spec: bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition}}}}
	if err := c.Create(ctx, tmpl); err != nil {
		t.Fatalf("a KubeadmConfigTemplate is refused: %v", err)
	}
}
