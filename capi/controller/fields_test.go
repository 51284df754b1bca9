package controller_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
)

// data reads a config's data Secret's value.
func (e *env) data(t *testing.T, c *bootstrapv1.KubeadmConfig) []byte {
	t.Helper()
	if c.Status.DataSecretName == nil {
		t.Fatalf("%s has no data; conditions %+v", c.Name, c.Status.Conditions)
	}
	s := &corev1.Secret{}
	if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: c.Namespace, Name: *c.Status.DataSecretName}, s); err != nil {
		t.Fatal(err)
	}
	return s.Data["value"]
}

// userPasswords returns each user's password hash in data.
func userPasswords(t *testing.T, format bootstrapv1.Format, data []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	if format == bootstrapv1.FormatIgnition {
		for _, u := range rendertest.Ignition(t, data).Passwd.Users {
			if u.PasswordHash != nil {
				out[u.Name] = *u.PasswordHash
			}
		}
		return out
	}
	var cfg struct {
		Users []struct{ Name, Passwd string } `json:"users"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.Users {
		out[u.Name] = u.Passwd
	}
	return out
}

// TestPasswdFrom: a user's passwdFrom Secret is read into the data's
// password hash in both formats, as CABPK does; attested mode, whose data
// carries no secrets, refuses it with a condition.
func TestPasswdFrom(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	if err := e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ops-password"},
		Data: map[string][]byte{"hash": []byte("$6$salt$fromsecret")}}); err != nil {
		t.Fatal(err)
	}
	users := []cabpkv1.User{{Name: "ops", PasswdFrom: cabpkv1.PasswdSource{Secret: cabpkv1.SecretPasswdSource{Name: "ops-password", Key: "hash"}}}}
	r := e.reconciler(controller.Config{})
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		_, cfg, err := e.Machine(ctx, cluster, "worker-"+string(format), false, bootstrapv1.KubeadmConfigSpec{Format: format, Users: users})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.reconcileOnce(t, r, cfg); err != nil {
			t.Fatal(err)
		}
		if got := userPasswords(t, format, e.data(t, cfg))["ops"]; got != "$6$salt$fromsecret" {
			t.Errorf("%s: ops's password hash %q, want the Secret's", format, got)
		}
	}

	_, cfg, err := e.Machine(ctx, cluster, "attested", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig, Users: users,
		Attested: &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	if c := condition(cfg, controller.ConditionDataSecretAvailable); c == nil || c.Reason != controller.ReasonInvalidSpec ||
		!strings.Contains(c.Message, "passwdFrom") || cfg.Status.DataSecretName != nil {
		t.Fatalf("attested passwdFrom: condition %+v, data %v", c, cfg.Status.DataSecretName)
	}
}

// controlPlaneCRD installs a control plane kind of Cluster API's contract
// (the CRD's contract label), whose objects carry spec.version.
func (e *env) controlPlaneCRD(t *testing.T) {
	t.Helper()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "testcontrolplanes.controlplane.gatehouse.test",
			"labels": map[string]any{clusterv1.GroupVersion.String(): "v1alpha1"}},
		"spec": map[string]any{
			"group": "controlplane.gatehouse.test", "scope": "Namespaced",
			"names": map[string]any{"kind": "TestControlPlane", "listKind": "TestControlPlaneList", "plural": "testcontrolplanes", "singular": "testcontrolplane"},
			"versions": []any{map[string]any{"name": "v1alpha1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	if err := e.Client.Create(t.Context(), crd); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// TestTemplateFiles: a contentFormat Template file is rendered with the
// version of the Cluster's control plane (its spec.version, "v"-prefixed),
// as CABPK renders it.
func TestTemplateFiles(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	e.controlPlaneCRD(t)
	cp := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "controlplane.gatehouse.test/v1alpha1", "kind": "TestControlPlane",
		"metadata": map[string]any{"namespace": ns, "name": "cp"}, "spec": map[string]any{"version": "1.36.4"}}}
	deadline := time.Now().Add(20 * time.Second)
	for err := e.Client.Create(ctx, cp); err != nil; err = e.Client.Create(ctx, cp) {
		if time.Now().After(deadline) {
			t.Fatalf("creating the control plane object: %v", err) // the CRD was never established
		}
		time.Sleep(100 * time.Millisecond)
	}
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	cluster.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.gatehouse.test", Kind: "TestControlPlane", Name: "cp"}
	if err := e.Client.Update(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	_, cfg, err := e.Machine(ctx, cluster, "worker", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition, Files: []cabpkv1.File{
		{Path: "/etc/cp-version", Content: "control plane {{ .controlPlane.version }}\n", ContentFormat: cabpkv1.FileContentFormatTemplate},
		{Path: "/etc/raw", Content: "{{ .controlPlane.version }}\n"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reconcileOnce(t, e.reconciler(controller.Config{}), cfg); err != nil {
		t.Fatal(err)
	}
	files, _ := e.dataFiles(t, cfg)
	if got := string(files["/etc/cp-version"]); got != "control plane v1.36.4\n" {
		t.Errorf("template rendered %q", got)
	}
	if got := string(files["/etc/raw"]); got != "{{ .controlPlane.version }}\n" {
		t.Errorf("a Raw file was changed: %q", got)
	}
}

// TestContainerLinuxConfig: CABPK's ignition.containerLinuxConfig is
// accepted by the API server (strict decoding of a CABPK spec works) and
// refused with an InvalidSpec condition saying how to write it as Butane.
func TestContainerLinuxConfig(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	_, cfg, err := e.Machine(t.Context(), cluster, "worker", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition,
		Ignition: &bootstrapv1.IgnitionSpec{ContainerLinuxConfig: cabpkv1.ContainerLinuxConfig{AdditionalConfig: "storage:\n  files: []\n"}}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Spec.Ignition.ContainerLinuxConfig.AdditionalConfig == "" {
		t.Fatal("the API server pruned containerLinuxConfig")
	}
	if err := e.reconcileOnce(t, e.reconciler(controller.Config{}), cfg); err != nil {
		t.Fatal(err)
	}
	c := condition(cfg, controller.ConditionDataSecretAvailable)
	if c == nil || c.Reason != controller.ReasonInvalidSpec || !strings.Contains(c.Message, "Butane") ||
		!strings.Contains(c.Message, "additionalConfig") || cfg.Status.DataSecretName != nil {
		t.Fatalf("condition %+v, data %v", c, cfg.Status.DataSecretName)
	}
}

// TestDiscoveryFile: a join with file discovery whose kubeconfig the spec
// describes gets that kubeconfig at kubeConfigPath, with the Cluster's
// endpoint and CA filled in, as CABPK writes it, and no bootstrap token.
func TestDiscoveryFile(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	ca := &corev1.Secret{}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-ca"}, ca); err != nil {
		t.Fatal(err)
	}
	r := e.reconciler(controller.Config{})
	const path = "/etc/kubernetes/discovery.conf"
	fileDiscovery := func() bootstrapv1.KubeadmConfigSpec {
		return bootstrapv1.KubeadmConfigSpec{JoinConfiguration: cabpkv1.JoinConfiguration{Discovery: cabpkv1.Discovery{File: cabpkv1.FileDiscovery{
			KubeConfigPath: path,
			KubeConfig: cabpkv1.FileDiscoveryKubeConfig{User: cabpkv1.KubeConfigUser{Exec: cabpkv1.KubeConfigAuthExec{
				Command: "/usr/local/bin/token-helper", Args: []string{"--cluster", "c1"}}}},
		}}}}
	}
	for _, format := range []bootstrapv1.Format{bootstrapv1.FormatCloudConfig, bootstrapv1.FormatIgnition} {
		spec := fileDiscovery()
		spec.Format = format
		_, cfg, err := e.Machine(ctx, cluster, "worker-"+string(format), false, spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.reconcileOnce(t, r, cfg); err != nil {
			t.Fatal(err)
		}
		files, _ := e.dataFiles(t, cfg)
		kc, err := clientcmd.Load(files[path])
		if err != nil {
			t.Fatalf("%s: the discovery kubeconfig at %s does not load: %v\n%s", format, path, err, files[path])
		}
		c, u := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster], kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo]
		if c == nil || u == nil || u.Exec == nil {
			t.Fatalf("%s: discovery kubeconfig without the current context's cluster and exec user:\n%s", format, files[path])
		}
		if c.Server != "https://10.0.0.1:6443" || string(c.CertificateAuthorityData) != string(ca.Data["tls.crt"]) {
			t.Errorf("%s: discovery kubeconfig's server %q and CA %q; want https://10.0.0.1:6443 and the c1-ca certificate", format, c.Server, c.CertificateAuthorityData)
		}
		if u.Exec.Command != "/usr/local/bin/token-helper" || u.Exec.APIVersion != "client.authentication.k8s.io/v1" || u.Exec.InteractiveMode != "Never" {
			t.Errorf("%s: exec user %+v; want the spec's command, API version client.authentication.k8s.io/v1 and interactive mode Never", format, u.Exec)
		}
		if join := string(kubeadmConfig(files)); !strings.Contains(join, "kubeConfigPath: "+path) || strings.Contains(join, "bootstrapToken") {
			t.Errorf("%s: the join does not discover through the file alone:\n%s", format, join)
		}
		if tokens := e.configTokens(t, cfg); len(tokens) != 0 {
			t.Errorf("%s: bootstrap tokens %v for a file discovery join, want none", format, tokens)
		}
	}

}
