// Package controllertest sets up what the bootstrap provider's controller
// reconciles, for tests of package capi/controller and of the manager
// binary: a real API server (envtest) with Cluster API's core CRDs and
// ours, Clusters with their kubeconfig and CA Secrets, and Machines and
// MachinePools with their KubeadmConfigs.
package controllertest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// KubernetesVersion is the spec.version of the Machines Machine creates.
const KubernetesVersion = "v1.36.4"

// WaitTimeout bounds WaitFor; generous, for loaded CI machines.
const WaitTimeout = 90 * time.Second

// Env is a real API server with Cluster API's core CRDs and ours.
type Env struct {
	// Config is an administrator's client configuration (client
	// certificate).
	Config *rest.Config
	// Client is an uncached client of Config with Scheme.
	Client client.Client
	// Scheme knows client-go's types, Cluster API's core types and ours.
	Scheme *k8sruntime.Scheme
}

// NewEnv starts the API server (testenv.NewEnvtest), stopped when the test
// ends.
func NewEnv(t testing.TB) *Env {
	t.Helper()
	core, _ := testenv.ClusterAPICRDs(t)
	crds, err := crdDir()
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEnv(testenv.NewEnvtest(t, core, crds))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Start starts the API server for a package's TestMain, where one serves
// all of the package's tests, each in namespaces of its own (Cluster API's
// suite_test.go pattern). The caller calls stop after m.Run. It runs on
// internal/testenv's processes, which die with the test binary even when a
// test panics and TestMain's stop never runs, with the CRDs installed by
// envtest.
func Start(ctx context.Context) (e *Env, stop func() error, err error) {
	core, _, err := testenv.ClusterAPICRDDirs(ctx)
	if err != nil {
		return nil, nil, err
	}
	crds, err := crdDir()
	if err != nil {
		return nil, nil, err
	}
	env, err := testenv.Start(ctx, testenv.Options{})
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			_ = env.Stop()
		}
	}()
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{core, crds}, ErrorIfPathMissing: true}); err != nil {
		return nil, nil, fmt.Errorf("installing CRDs: %w", err)
	}
	e, err = newEnv(env.Config)
	if err != nil {
		return nil, nil, err
	}
	return e, env.Stop, nil
}

// newEnv is the Env of an API server with the CRDs installed.
func newEnv(cfg *rest.Config) (*Env, error) {
	scheme := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, bootstrapv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme}, nil
}

// crdDir is the repository's config/crd, found from this source file so
// that tests in any directory can call NewEnv.
func crdDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("locating package controllertest's source to find config/crd")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "config", "crd"), nil
}

// Namespace creates a namespace of its own for a test and returns its name.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "capi-"}}
	if err := e.Client.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// Cluster creates a Cluster with provisioned infrastructure, its control
// plane initialised or not, and its kubeconfig Secret pointing at the test
// API server (the workload cluster is the management cluster here).
func (e *Env) Cluster(t testing.TB, ns, name string, initialized bool) *clusterv1.Cluster {
	t.Helper()
	ctx := t.Context()
	c := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "10.0.0.1", Port: 6443},
			ClusterNetwork: clusterv1.ClusterNetwork{
				ServiceDomain: "cluster.example",
				Pods:          clusterv1.NetworkRanges{CIDRBlocks: []string{"10.244.0.0/16"}},
				Services:      clusterv1.NetworkRanges{CIDRBlocks: []string{"10.96.0.0/12"}},
			},
		},
	}
	if err := e.Client.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	c.Status.Initialization = clusterv1.ClusterInitializationStatus{InfrastructureProvisioned: ptr.To(true), ControlPlaneInitialized: ptr.To(initialized)}
	if err := e.Client.Status().Update(ctx, c); err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-kubeconfig",
		Labels: map[string]string{clusterv1.ClusterNameLabel: name}},
		Data: map[string][]byte{"value": testenv.Kubeconfig(t, e.Config)}, Type: clusterv1.ClusterSecretType}
	if err := e.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	return c
}

// SeedCA creates the cluster's CA Secrets ("<cluster>-ca|etcd|proxy|sa"),
// as an earlier `kubeadm init` through the controller did.
func (e *Env) SeedCA(t testing.TB, cluster *clusterv1.Cluster) {
	t.Helper()
	certs := secret.NewCertificatesForInitialControlPlane(&cabpkv1.ClusterConfiguration{})
	owner := metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID}
	if err := certs.LookupOrGenerate(t.Context(), e.Client, client.ObjectKeyFromObject(cluster), owner); err != nil {
		t.Fatal(err)
	}
}

// Machine creates a Machine of cluster and its KubeadmConfig with spec,
// owned by it, both named name. It returns an error rather than failing
// the test so that it can run in other goroutines.
func (e *Env) Machine(ctx context.Context, cluster *clusterv1.Cluster, name string, controlPlane bool, spec bootstrapv1.KubeadmConfigSpec) (*clusterv1.Machine, *bootstrapv1.KubeadmConfig, error) {
	labels := map[string]string{clusterv1.ClusterNameLabel: cluster.Name}
	if controlPlane {
		labels[clusterv1.MachineControlPlaneLabel] = ""
	}
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name, Labels: labels},
		Spec: clusterv1.MachineSpec{
			ClusterName: cluster.Name,
			Version:     KubernetesVersion,
			Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: name}},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "TestMachine", Name: name},
		},
	}
	if err := e.Client.Create(ctx, m); err != nil {
		return nil, nil, fmt.Errorf("creating Machine %s: %w", name, err)
	}
	cfg := &bootstrapv1.KubeadmConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: m.Name, UID: m.UID}}},
		Spec: spec,
	}
	if err := e.Client.Create(ctx, cfg); err != nil {
		return nil, nil, fmt.Errorf("creating KubeadmConfig %s: %w", name, err)
	}
	return m, cfg, nil
}

// MachinePool creates a MachinePool of cluster with replicas replicas and
// its KubeadmConfig with spec, owned by it, both named name, as Cluster
// API's MachinePool controller adopts the config its template names. It
// returns an error rather than failing the test so that it can run in
// other goroutines.
func (e *Env) MachinePool(ctx context.Context, cluster *clusterv1.Cluster, name string, replicas int32, spec bootstrapv1.KubeadmConfigSpec) (*clusterv1.MachinePool, *bootstrapv1.KubeadmConfig, error) {
	labels := map[string]string{clusterv1.ClusterNameLabel: cluster.Name}
	mp := &clusterv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name, Labels: labels},
		Spec: clusterv1.MachinePoolSpec{
			ClusterName: cluster.Name,
			Replicas:    ptr.To(replicas),
			Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
				ClusterName: cluster.Name,
				Version:     KubernetesVersion,
				Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: name}},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "TestMachinePool", Name: name},
			}},
		},
	}
	if err := e.Client.Create(ctx, mp); err != nil {
		return nil, nil, fmt.Errorf("creating MachinePool %s: %w", name, err)
	}
	cfg := &bootstrapv1.KubeadmConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachinePool", Name: mp.Name, UID: mp.UID}}},
		Spec: spec,
	}
	if err := e.Client.Create(ctx, cfg); err != nil {
		return nil, nil, fmt.Errorf("creating KubeadmConfig %s: %w", name, err)
	}
	return mp, cfg, nil
}

// WaitFor polls the KubeadmConfigs of namespace ns until ok holds for them
// and returns them; after WaitTimeout it logs each one's data Secret and
// conditions and fails the test, saying it was waiting for what.
func (e *Env) WaitFor(t testing.TB, ns, what string, ok func([]bootstrapv1.KubeadmConfig) bool) []bootstrapv1.KubeadmConfig {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), WaitTimeout)
	defer cancel()
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	for {
		var list bootstrapv1.KubeadmConfigList
		if err := e.Client.List(ctx, &list, client.InNamespace(ns)); err == nil && ok(list.Items) {
			return list.Items
		}
		select {
		case <-ctx.Done():
			for _, c := range list.Items {
				t.Logf("%s: dataSecretName %v conditions %+v", c.Name, ptr.Deref(c.Status.DataSecretName, ""), c.Status.Conditions)
			}
			t.Fatalf("timed out waiting for %s", what)
		case <-ticker.C:
		}
	}
}
