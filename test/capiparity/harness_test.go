package capiparity

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
	"github.com/gatehouse-dev/gatehouse/capi/controller/controllertest"
)

// kubernetesVersion is every sample Machine's spec.version.
const kubernetesVersion = controllertest.KubernetesVersion

// env is the API server both controllers' inputs are read from: our
// controller reconciles the samples' KubeadmConfigs there, and upstream's
// mapping reads the same Clusters, CA Secrets and Secrets.
var env *controllertest.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	e, stop, err := controllertest.Start(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test API server:", err)
		return 1
	}
	env = e
	code := m.Run()
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the test API server:", err)
		code = 1
	}
	return code
}

// fixtureCAs are the cluster CAs every sample Cluster has, as an earlier
// init made them, so that both controllers write the same ones.
type fixtureCAs map[secret.Purpose][2][]byte

func newFixtureCAs(t *testing.T) fixtureCAs {
	t.Helper()
	certs := secret.NewCertificatesForInitialControlPlane(&cabpkv1.ClusterConfiguration{})
	if err := certs.Generate(); err != nil {
		t.Fatal(err)
	}
	out := fixtureCAs{}
	for _, c := range certs {
		out[c.Purpose] = [2][]byte{c.KeyPair.Cert, c.KeyPair.Key}
	}
	// An external etcd's client certificate: any key pair serves.
	client := secret.NewCertificatesForInitialControlPlane(&cabpkv1.ClusterConfiguration{})
	if err := client.Generate(); err != nil {
		t.Fatal(err)
	}
	kp := client.GetByPurpose(secret.ClusterCA).KeyPair
	out[secret.APIServerEtcdClient] = [2][]byte{kp.Cert, kp.Key}
	return out
}

// harness renders samples through both controllers.
type harness struct {
	ns  string
	cas fixtureCAs
	r   *controller.Reconciler
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{ns: env.Namespace(t), cas: newFixtureCAs(t)}
	fixtureNames = h.cas.names()
	h.r = controller.New(controller.Config{Client: env.Client, APIReader: env.Client, LockClient: env.Client,
		Workload: controller.NewKubeconfigClients(env.Client, env.Client, 50, 100)})
	for name, data := range sampleSecrets {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		if err := env.Client.Create(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// rendered is one controller's outcome for one sample.
type rendered struct {
	data []byte
	// failure says why there is no data.
	failure string
}

// cluster makes a Cluster of its own for one sample rendering, with its
// CA Secrets; its control plane is initialised unless the sample inits it.
// With an external etcd, its CA Secret holds the certificate only, as
// users create it.
func (h *harness) cluster(t *testing.T, name string, r role, externalEtcd bool) *clusterv1.Cluster {
	t.Helper()
	c := env.Cluster(t, h.ns, name, r != roleInit)
	for purpose, kp := range h.cas {
		if purpose == secret.EtcdCA && externalEtcd {
			kp[1] = nil // an external etcd's CA comes without its key
		}
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: secret.Name(name, purpose), Labels: map[string]string{clusterv1.ClusterNameLabel: name}},
			Data:       map[string][]byte{secret.TLSCrtDataName: kp[0], secret.TLSKeyDataName: kp[1]},
			Type:       clusterv1.ClusterSecretType,
		}
		if err := env.Client.Create(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// ours creates the sample's Machine and KubeadmConfig (from its YAML, with
// strict field validation, as kubectl does by default) and runs our
// controller's Reconcile until the data Secret exists or it says why not.
func (h *harness) ours(t *testing.T, cluster *clusterv1.Cluster, name string, s sample, format string) rendered {
	t.Helper()
	ctx := t.Context()
	labels := map[string]string{clusterv1.ClusterNameLabel: cluster.Name}
	if s.role != roleJoin {
		labels[clusterv1.MachineControlPlaneLabel] = ""
	}
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name, Labels: labels},
		Spec: clusterv1.MachineSpec{
			ClusterName: cluster.Name,
			Version:     kubernetesVersion,
			Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: name}},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "TestMachine", Name: name},
		},
	}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{}
	if err := yaml.Unmarshal([]byte(s.spec), &spec); err != nil {
		t.Fatalf("sample %q: %v", s.name, err)
	}
	spec["format"] = format
	cfg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": bootstrapv1.GroupVersion.String(),
		"kind":       "KubeadmConfig",
		"metadata": map[string]any{
			"name": name, "namespace": h.ns, "labels": toAny(labels),
			"ownerReferences": []any{map[string]any{"apiVersion": clusterv1.GroupVersion.String(), "kind": "Machine", "name": m.Name, "uid": string(m.UID)}},
		},
		"spec": spec,
	}}
	if err := env.Client.Create(ctx, cfg, client.FieldValidation("Strict")); err != nil {
		return rendered{failure: "refused by the API server: " + h.scrub(err.Error(), name)}
	}
	key := client.ObjectKey{Namespace: h.ns, Name: name}
	var last error
	for range 5 {
		res, err := h.r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		last = err
		c := &bootstrapv1.KubeadmConfig{}
		if err := env.Client.Get(ctx, key, c); err != nil {
			t.Fatal(err)
		}
		if c.Status.DataSecretName != nil {
			sec := &corev1.Secret{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: *c.Status.DataSecretName}, sec); err != nil {
				t.Fatal(err)
			}
			return rendered{data: sec.Data["value"]}
		}
		if err == nil && res.IsZero() {
			cond := meta.FindStatusCondition(c.Status.Conditions, controller.ConditionDataSecretAvailable)
			if cond == nil {
				return rendered{failure: "no data and no condition"}
			}
			return rendered{failure: cond.Reason + ": " + h.scrub(cond.Message, name)}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return rendered{failure: fmt.Sprintf("no data after 5 reconciles: %v", last)}
}

// upstream renders the sample as CABPK does, from the same Cluster.
func (h *harness) upstream(t *testing.T, cluster *clusterv1.Cluster, s sample, format string) rendered {
	t.Helper()
	spec, err := upstreamSpec(s, format)
	if err != nil {
		t.Fatalf("sample %q is not a valid CABPK spec: %v", s.name, err)
	}
	fresh := &clusterv1.Cluster{}
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(cluster), fresh); err != nil {
		t.Fatal(err)
	}
	data, err := upstreamData(t.Context(), env.Client, fresh, spec, s.role)
	if err != nil {
		return rendered{failure: "upstream: " + err.Error()}
	}
	return rendered{data: data}
}

// upstreamSpec decodes the sample strictly into CABPK's type.
func upstreamSpec(s sample, format string) (*cabpkv1.KubeadmConfigSpec, error) {
	spec := &cabpkv1.KubeadmConfigSpec{}
	if err := yaml.UnmarshalStrict([]byte(s.spec), spec); err != nil {
		return nil, err
	}
	spec.Format = cabpkv1.Format(format)
	return spec, nil
}

// scrub replaces the names of one rendering's objects in a message.
func (h *harness) scrub(msg, name string) string {
	return strings.NewReplacer(h.ns, "<namespace>", name, "<name>").Replace(msg)
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// sizeInBytes is a size in a failure message, which may change from run to
// run: the fixture CAs' keys are made anew.
var sizeInBytes = regexp.MustCompile(`\b[0-9]+ bytes\b`)

// meanings are one sample's data in one format, as models, or why one
// side has none.
type meanings struct {
	ours, upstream map[string]any
	// failure is the (data) difference when a side rendered nothing.
	failure *difference
}

// models builds both sides' models of one sample's data; the sample's
// cluster name and the fixture CAs read the same in every sample.
func models(s sample, format, clusterName string, ours, upstream rendered) (meanings, error) {
	if ours.failure != "" || upstream.failure != "" {
		o, u := "rendered", "rendered"
		if ours.failure != "" {
			o = ours.failure
		}
		if upstream.failure != "" {
			u = upstream.failure
		}
		return meanings{failure: &difference{Path: "(data)", Ours: showUpTo(sizeInBytes.ReplaceAllString(o, "<n> bytes"), 400),
			Upstream: showUpTo(sizeInBytes.ReplaceAllString(u, "<n> bytes"), 400)}}, nil
	}
	opts := modelOptions{}
	if spec, err := upstreamSpec(s, format); err == nil {
		opts.userToken = spec.JoinConfiguration.Discovery.BootstrapToken.Token
	}
	var m meanings
	var err error
	if format == ignitionFmt {
		if m.ours, err = ignitionV3Model(ours.data, opts); err != nil {
			return m, fmt.Errorf("ours: %w", err)
		}
		if m.upstream, err = ignitionV2Model(upstream.data, opts); err != nil {
			return m, fmt.Errorf("upstream: %w", err)
		}
	} else {
		if m.ours, err = cloudConfigModel(ours.data, opts); err != nil {
			return m, fmt.Errorf("ours: %w", err)
		}
		if m.upstream, err = cloudConfigModel(upstream.data, opts); err != nil {
			return m, fmt.Errorf("upstream: %w", err)
		}
	}
	kubeconfigMeanings(m.ours)
	kubeconfigMeanings(m.upstream)
	scrub(m.ours, clusterName)
	scrub(m.upstream, clusterName)
	return m, nil
}

// kubeconfigMeanings replaces the content of each file that is a
// kubeconfig (the discovery file) by what clientcmd loads from it, so
// that field order, apiVersion/kind lines and base64 do not count.
func kubeconfigMeanings(model map[string]any) {
	files, _ := model["files"].(keyed)
	for _, f := range files {
		fm, ok := f.(map[string]any)
		if !ok {
			continue
		}
		for _, key := range []string{"content", "contents"} {
			content, ok := fm[key].(string)
			if !ok {
				continue
			}
			if cfg, err := clientcmd.Load([]byte(content)); err == nil && len(cfg.Clusters) > 0 {
				fm[key] = kubeconfigMeaning(cfg)
			}
		}
	}
}

func kubeconfigMeaning(cfg *clientcmdapi.Config) map[string]any {
	clusters, users, contexts := map[string]any{}, map[string]any{}, map[string]any{}
	for name, c := range cfg.Clusters {
		clusters[name] = map[string]any{"server": c.Server, "tlsServerName": c.TLSServerName, "insecureSkipTLSVerify": c.InsecureSkipTLSVerify,
			"certificateAuthorityData": string(c.CertificateAuthorityData), "proxyURL": c.ProxyURL}
	}
	for name, u := range cfg.AuthInfos {
		user := map[string]any{}
		if p := u.AuthProvider; p != nil {
			user["authProvider"] = map[string]any{"name": p.Name, "config": p.Config}
		}
		if e := u.Exec; e != nil {
			env := map[string]string{}
			for _, v := range e.Env {
				env[v.Name] = v.Value
			}
			user["exec"] = map[string]any{"command": e.Command, "args": e.Args, "env": env, "apiVersion": e.APIVersion,
				"provideClusterInfo": e.ProvideClusterInfo, "interactiveMode": string(e.InteractiveMode)}
		}
		users[name] = user
	}
	for name, c := range cfg.Contexts {
		contexts[name] = map[string]any{"cluster": c.Cluster, "user": c.AuthInfo, "namespace": c.Namespace}
	}
	return map[string]any{"clusters": clusters, "users": users, "contexts": contexts, "currentContext": cfg.CurrentContext}
}

// differences lists where the two sides' meanings differ.
func (m meanings) differences() []difference {
	if m.failure != nil {
		return []difference{*m.failure}
	}
	var out []difference
	diffValues("", m.ours, m.upstream, &out)
	return out
}

// fixtureNames replaces the fixture CAs (made anew by each run) in the
// models, so that a difference holding one reads the same every run.
var fixtureNames *strings.Replacer

func (cas fixtureCAs) names() *strings.Replacer {
	var pairs []string
	for purpose, kp := range cas {
		for i, b := range kp {
			if len(b) == 0 {
				continue
			}
			what := fmt.Sprintf("<%s %s>", purpose, [2]string{"certificate", "key"}[i])
			pairs = append(pairs, string(b), what, base64.StdEncoding.EncodeToString(b), what+" (base64)")
		}
	}
	return strings.NewReplacer(pairs...)
}

// scrub replaces the fixture CAs in every string of a model, and a
// string that is the cluster's name.
func scrub(v any, clusterName string) any {
	switch x := v.(type) {
	case string:
		if x == clusterName {
			return "<cluster name>"
		}
		return fixtureNames.Replace(x)
	case map[string]any:
		for k, e := range x {
			x[k] = scrub(e, clusterName)
		}
	case keyed:
		for k, e := range x {
			x[k] = scrub(e, clusterName)
		}
	case []any:
		for i, e := range x {
			x[i] = scrub(e, clusterName)
		}
	case []string:
		for i, e := range x {
			x[i] = scrub(e, clusterName).(string)
		}
	}
	return v
}
