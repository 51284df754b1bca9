package controller_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
	"github.com/gatehouse-dev/gatehouse/capi/controller/controllertest"
	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/capi/render/rendertest"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// env is controllertest's API server, with what only this package's tests
// need: the controller in a manager, or a Reconciler to call directly.
type env struct{ *controllertest.Env }

// startManager runs the controller in a manager until the test ends.
func (e *env) startManager(t *testing.T, o controller.Config) {
	t.Helper()
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme:  e.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Each test runs its own manager in this one process.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
		Client:     client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.ConfigMap{}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	o.Client, o.APIReader, o.LockClient = mgr.GetClient(), mgr.GetAPIReader(), mgr.GetClient()
	o.Workload = controller.NewKubeconfigClients(mgr.GetClient(), mgr.GetAPIReader(), 50, 100)
	if err := controller.New(o).SetupWithManager(mgr, 4); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// reconciler is a Reconciler called directly by a test.
func (e *env) reconciler(o controller.Config) *controller.Reconciler {
	o.Client, o.APIReader, o.LockClient = e.Client, e.Client, e.Client
	o.Workload = controller.NewKubeconfigClients(e.Client, e.Client, 50, 100)
	return controller.New(o)
}

// reconcileOnce calls r.Reconcile for cfg and reads cfg back; it returns
// Reconcile's error.
func (e *env) reconcileOnce(t *testing.T, r *controller.Reconciler, cfg *bootstrapv1.KubeadmConfig) error {
	t.Helper()
	_, err := r.Reconcile(t.Context(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cfg)})
	if gerr := e.Client.Get(t.Context(), client.ObjectKeyFromObject(cfg), cfg); gerr != nil {
		t.Fatal(gerr)
	}
	return err
}

func readyReason(c *bootstrapv1.KubeadmConfig) string {
	if cond := meta.FindStatusCondition(c.Status.Conditions, controller.ConditionReady); cond != nil {
		return cond.Reason
	}
	return ""
}

// dataFiles reads a config's data Secret and returns the files it writes,
// after checking the format with cloud-init schema or the Ignition validator.
func (e *env) dataFiles(t *testing.T, c *bootstrapv1.KubeadmConfig) (map[string][]byte, string) {
	t.Helper()
	s := &corev1.Secret{}
	if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: c.Namespace, Name: *c.Status.DataSecretName}, s); err != nil {
		t.Fatal(err)
	}
	if s.Type != clusterv1.ClusterSecretType || string(s.Data["format"]) != string(c.Spec.Format) || !metav1.IsControlledBy(s, c) {
		t.Fatalf("data Secret %s: type %q, format %q (want %q), owners %v", s.Name, s.Type, s.Data["format"], c.Spec.Format, s.OwnerReferences)
	}
	return rendertest.FilesAndText(t, c.Spec.Format, s.Data["value"])
}

// kubeadmConfig is the kubeadm configuration among a data's files, in
// either format's place.
func kubeadmConfig(files map[string][]byte) []byte {
	if c, ok := files[render.IgnitionKubeadmConfigPath]; ok {
		return c
	}
	return files[render.KubeadmConfigPath]
}

// kubeadmValidate runs the real `kubeadm config validate` on a config.
func kubeadmValidate(t *testing.T, config []byte) {
	t.Helper()
	dir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeadm.yaml")
	if err := os.WriteFile(path, config, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), filepath.Join(dir, "kubeadm"), "config", "validate", "--config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("kubeadm config validate: %v\n%s\nconfig:\n%s", err, out, config)
	}
}

func formatOf(i int) bootstrapv1.Format {
	if i%2 == 0 {
		return bootstrapv1.FormatCloudConfig
	}
	return bootstrapv1.FormatIgnition
}

// TestInitJoinOrdering creates 3 control-plane and 3 worker Machines at
// once: exactly one gets `kubeadm init` (under the lock) and the generated
// CAs; the others wait until the control plane is initialised, then the
// control planes get a control-plane join with the CAs and the workers a
// join with a bootstrap token and the CA hash.
func TestInitJoinOrdering(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	e.startManager(t, controller.Config{})
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", false)

	g, gctx := errgroup.WithContext(ctx)
	for i := range 6 {
		g.Go(func() error {
			cp := i < 3
			name := fmt.Sprintf("worker-%d", i-3)
			if cp {
				name = fmt.Sprintf("cp-%d", i)
			}
			_, _, err := e.Machine(gctx, cluster, name, cp, bootstrapv1.KubeadmConfigSpec{Format: formatOf(i)})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	var initName string
	e.WaitFor(t, ns, "one init and five waiting", func(cs []bootstrapv1.KubeadmConfig) bool {
		withData, lockWaiters, cpWaiters := 0, 0, 0
		for i := range cs {
			switch {
			case cs[i].Status.DataSecretName != nil:
				withData++
				initName = cs[i].Name
			case readyReason(&cs[i]) == controller.ReasonWaitingForInitLock:
				lockWaiters++
			case readyReason(&cs[i]) == controller.ReasonWaitingForControlPlane:
				cpWaiters++
			}
		}
		return len(cs) == 6 && withData == 1 && lockWaiters == 2 && cpWaiters == 3
	})
	if !strings.HasPrefix(initName, "cp-") {
		t.Fatalf("%s got the init data; want a control plane", initName)
	}
	for _, purpose := range []string{"ca", "etcd", "proxy", "sa"} {
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-" + purpose}, &corev1.Secret{}); err != nil {
			t.Errorf("CA Secret c1-%s: %v", purpose, err)
		}
	}
	initCfg := &bootstrapv1.KubeadmConfig{}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: initName}, initCfg); err != nil {
		t.Fatal(err)
	}
	files, text := e.dataFiles(t, initCfg)
	kubeadmValidate(t, kubeadmConfig(files))
	for _, want := range []string{"kind: InitConfiguration", "kind: ClusterConfiguration", "controlPlaneEndpoint: 10.0.0.1:6443",
		"clusterName: c1", "kubernetesVersion: " + controllertest.KubernetesVersion, "podSubnet: 10.244.0.0/16", "serviceSubnet: 10.96.0.0/12", "dnsDomain: cluster.example"} {
		if !strings.Contains(string(kubeadmConfig(files)), want) {
			t.Errorf("init kubeadm config lacks %q:\n%s", want, kubeadmConfig(files))
		}
	}
	if _, ok := files["/etc/kubernetes/pki/ca.key"]; !ok || !strings.Contains(text, "init") {
		t.Errorf("init data lacks the cluster CA key or kubeadm init")
	}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-lock"}, &corev1.ConfigMap{}); err != nil {
		t.Errorf("init lock: %v", err)
	}

	// The control plane provider reports the control plane initialised.
	cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	if err := e.Client.Status().Update(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	configs := e.WaitFor(t, ns, "all six with data", func(cs []bootstrapv1.KubeadmConfig) bool {
		for i := range cs {
			if cs[i].Status.DataSecretName == nil || !ptr.Deref(ptr.Deref(cs[i].Status.Initialization, bootstrapv1.Initialization{}).DataSecretCreated, false) {
				return false
			}
		}
		return len(cs) == 6
	})
	for i := range configs {
		c := &configs[i]
		if c.Name == initName {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			files, _ := e.dataFiles(t, c)
			join := kubeadmConfig(files)
			kubeadmValidate(t, join)
			if !strings.Contains(string(join), "kind: JoinConfiguration") || !strings.Contains(string(join), "caCertHashes:") ||
				!strings.Contains(string(join), "apiServerEndpoint: 10.0.0.1:6443") {
				t.Errorf("join config:\n%s", join)
			}
			_, hasKey := files["/etc/kubernetes/pki/ca.key"]
			cp := strings.HasPrefix(c.Name, "cp-")
			if cp != strings.Contains(string(join), "controlPlane:") || cp != hasKey {
				t.Errorf("control plane %v: join has controlPlane %v, data has the CA key %v", cp, strings.Contains(string(join), "controlPlane:"), hasKey)
			}
			if !strings.Contains(string(join), "token: ") {
				t.Errorf("join config without a bootstrap token:\n%s", join)
			}
			// A worker joins with Cluster API's uninitialized taint, which
			// the Machine controller removes once it synced the labels
			// (CABPK's joinWorker); a control plane without it.
			if got := uninitializedTaints(t, join); got != map[bool]int{true: 0, false: 1}[cp] {
				t.Errorf("control plane %v: %d %s taints in the join, want %d:\n%s", cp, got, clusterv1.NodeUninitializedTaint.Key,
					map[bool]int{true: 0, false: 1}[cp], join)
			}
		})
	}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-lock"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("the init lock is still held once the control plane is initialised: %v", err)
	}
}

// uninitializedTaints counts Cluster API's uninitialized taint in a
// kubeadm JoinConfiguration.
func uninitializedTaints(t *testing.T, join []byte) int {
	t.Helper()
	var doc struct {
		NodeRegistration struct {
			Taints []corev1.Taint `json:"taints"`
		} `json:"nodeRegistration"`
	}
	if err := yaml.Unmarshal(join, &doc); err != nil {
		t.Fatalf("parsing the JoinConfiguration: %v", err)
	}
	n := 0
	for _, taint := range doc.NodeRegistration.Taints {
		if taint.MatchTaint(&clusterv1.NodeUninitializedTaint) {
			n++
		}
	}
	return n
}

// TestNoBaseTemplate: a Kubernetes version without pinned components gets
// a clear condition and no data.
func TestNoBaseTemplate(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	cluster := e.Cluster(t, ns, "c1", true)
	m, cfg, err := e.Machine(t.Context(), cluster, "worker", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatCloudConfig})
	if err != nil {
		t.Fatal(err)
	}
	m.Spec.Version = "v1.99.0"
	if err := e.Client.Update(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	r := e.reconciler(controller.Config{})
	if err := e.reconcileOnce(t, r, cfg); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(cfg.Status.Conditions, controller.ConditionDataSecretAvailable)
	if cond == nil || cond.Reason != controller.ReasonNoBaseTemplate || !strings.Contains(cond.Message, "v1.36") || cfg.Status.DataSecretName != nil {
		t.Fatalf("condition %+v, data %v", cond, cfg.Status.DataSecretName)
	}
}

// tokenSecret reads a config's bootstrap token Secret from the workload
// cluster (the test API server); the token is the one in its join data.
func (e *env) tokenSecret(t *testing.T, c *bootstrapv1.KubeadmConfig) (*corev1.Secret, error) {
	t.Helper()
	files, _ := e.dataFiles(t, c)
	return e.tokenSecretFrom(t, files)
}

func (e *env) tokenSecretFrom(t *testing.T, files map[string][]byte) (*corev1.Secret, error) {
	t.Helper()
	m := regexp.MustCompile(`token: ([a-z0-9]{6})\.([a-z0-9]{16})`).FindStringSubmatch(string(kubeadmConfig(files)))
	if m == nil {
		t.Fatalf("no bootstrap token in the join config:\n%s", kubeadmConfig(files))
	}
	s := &corev1.Secret{}
	err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "bootstrap-token-" + m[1]}, s)
	if err == nil && string(s.Data["token-secret"]) != m[2] {
		t.Fatalf("the token Secret's secret is not the one in the data")
	}
	return s, err
}

// TestTokenRefresh: a joining Machine's token is extended (same token,
// later expiration) once less than half its TTL is left, until the node
// joins; then it is deleted. A token that vanished is reported.
func TestTokenRefresh(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	cluster := e.Cluster(t, ns, "c1", true)
	got := &bootstrapv1.KubeadmConfig{}
	e.SeedCA(t, cluster)

	start := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	clock := clocktesting.NewFakePassiveClock(start)
	ttl := 15 * time.Minute
	r := e.reconciler(controller.Config{Clock: clock, TokenTTL: ttl})
	m, cfg, err := e.Machine(ctx, cluster, "worker-0", false, bootstrapv1.KubeadmConfigSpec{Format: bootstrapv1.FormatIgnition})
	if err != nil {
		t.Fatal(err)
	}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cfg)}
	reconcile := func() ctrl.Result {
		t.Helper()
		res, err := r.Reconcile(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Get(ctx, req.NamespacedName, got); err != nil {
			t.Fatal(err)
		}
		return res
	}
	expiration := func() time.Time {
		t.Helper()
		s, err := e.tokenSecret(t, got)
		if err != nil {
			t.Fatal(err)
		}
		exp, err := time.Parse(time.RFC3339, string(s.Data["expiration"]))
		if err != nil {
			t.Fatal(err)
		}
		return exp
	}

	res := reconcile()
	if got := expiration(); !got.Equal(start.Add(ttl)) {
		t.Fatalf("new token expires %v, want %v", got, start.Add(ttl))
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > ttl/2 {
		t.Fatalf("requeue after %v, want (0, %v]", res.RequeueAfter, ttl/2)
	}
	if !slices.Contains(got.Finalizers, controller.Finalizer) {
		t.Fatalf("no cleanup finalizer on a config with a token: %v", got.Finalizers)
	}

	for _, step := range []struct {
		advance time.Duration
		want    time.Time
	}{
		{5 * time.Minute, start.Add(ttl)},                  // 10 min left: untouched
		{4 * time.Minute, start.Add(9*time.Minute + ttl)},  // 6 min left: extended
		{7 * time.Minute, start.Add(9*time.Minute + ttl)},  // 8 min left: untouched
		{2 * time.Minute, start.Add(18*time.Minute + ttl)}, // 6 min left: extended
	} {
		clock.SetTime(clock.Now().Add(step.advance))
		reconcile()
		if got := expiration(); !got.Equal(step.want) {
			t.Fatalf("at %v: token expires %v, want %v", clock.Now().Sub(start), got, step.want)
		}
	}

	// The node joins: the token is deleted and no longer extended.
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: "worker-0"}
	if err := e.Client.Status().Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	reconcile()
	if _, err := e.tokenSecret(t, got); !apierrors.IsNotFound(err) {
		t.Fatalf("token after the node joined: %v", err)
	}
	if _, ok := got.Annotations["bootstrap.gatehouse.dev/managed-bootstrap-token"]; ok || slices.Contains(got.Finalizers, controller.Finalizer) {
		t.Fatalf("a joined config keeps its token annotation %v or finalizer %v", got.Annotations, got.Finalizers)
	}

	// A token that vanished before the node joined is reported.
	_, cfg2, err := e.Machine(ctx, cluster, "worker-1", false, bootstrapv1.KubeadmConfigSpec{})
	if err != nil {
		t.Fatal(err)
	}
	req = ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cfg2)}
	reconcile()
	s, err := e.tokenSecret(t, got)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	clock.SetTime(clock.Now().Add(ttl / 2)) // the next look at the token
	reconcile()
	if readyReason(got) != controller.ReasonBootstrapTokenExpired {
		t.Fatalf("vanished token: conditions %+v", got.Status.Conditions)
	}
}

// fetch GETs a URL trusting only the test CA, as a booting machine does.
func fetch(t *testing.T, pool *x509.CertPool, u string) (int, []byte) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// TestUserDataStore keeps the data in a real MinIO bucket (TLS, SSE-S3):
// the Secret holds only a stub (presigned HTTPS URL, or an s3:// source
// for Ignition), the URL serves the full data, and the object and the
// bootstrap token are deleted when the Machine goes away.
func TestUserDataStore(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	s3 := testenv.StartMinIO(t, testenv.MinIOOptions{SSE: true, Bucket: "bootstrap-data"})
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"}, Data: map[string][]byte{
		"accessKeyID": []byte(s3.AccessKeyID), "secretAccessKey": []byte(s3.SecretAccessKey), "ca.crt": s3.CACertPEM}}
	if err := e.Client.Create(ctx, creds); err != nil {
		t.Fatal(err)
	}
	store, err := userdatastore.New(userdatastore.Config{Endpoint: s3.Endpoint, Bucket: s3.Bucket,
		AccessKeyID: s3.AccessKeyID, SecretAccessKey: s3.SecretAccessKey, RootCAs: s3.RootCAs})
	if err != nil {
		t.Fatal(err)
	}
	exists := func(key string) bool {
		t.Helper()
		u, err := store.PresignedGetURL(ctx, key, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		status, _ := fetch(t, s3.RootCAs, u.String())
		return status == http.StatusOK
	}

	e.startManager(t, controller.Config{})
	cluster := e.Cluster(t, ns, "c1", true)
	e.SeedCA(t, cluster)
	tests := []struct {
		name   string
		format bootstrapv1.Format
		stub   string
	}{
		{"cloud-config-presigned", bootstrapv1.FormatCloudConfig, "presigned-url"},
		{"ignition-presigned", bootstrapv1.FormatIgnition, "presigned-url"},
		{"ignition-s3", bootstrapv1.FormatIgnition, "s3-uri"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, cfg, err := e.Machine(ctx, cluster, tc.name, false, bootstrapv1.KubeadmConfigSpec{Format: tc.format,
				UserDataStore: &bootstrapv1.UserDataStore{Endpoint: s3.Endpoint, Bucket: s3.Bucket, CredentialsSecret: "s3", Stub: tc.stub}})
			if err != nil {
				t.Fatal(err)
			}
			e.WaitFor(t, ns, tc.name+" data", func(cs []bootstrapv1.KubeadmConfig) bool {
				for i := range cs {
					if cs[i].Name == tc.name && cs[i].Status.DataSecretName != nil {
						*cfg = cs[i]
						return true
					}
				}
				return false
			})
			sec := &corev1.Secret{}
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: *cfg.Status.DataSecretName}, sec); err != nil {
				t.Fatal(err)
			}
			stub := string(sec.Data["value"])
			key := userdatastore.ObjectKey(ns, cfg.Name, cfg.UID)
			if strings.Contains(stub, "kubeadm") || strings.Contains(stub, "token") {
				t.Fatalf("the stub holds more than a pointer:\n%s", stub)
			}
			var full []byte
			switch tc.stub {
			case "s3-uri":
				if !strings.Contains(stub, "s3://"+s3.Bucket+"/"+key) {
					t.Fatalf("stub does not name s3://%s/%s:\n%s", s3.Bucket, key, stub)
				}
				u, err := store.PresignedGetURL(ctx, key, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				_, full = fetch(t, s3.RootCAs, u.String())
			default:
				u := regexp.MustCompile(`https://[^\s"]+`).FindString(stub)
				if u == "" {
					t.Fatalf("no presigned HTTPS URL in the stub:\n%s", stub)
				}
				u = strings.ReplaceAll(u, `\u0026`, "&")
				var status int
				if status, full = fetch(t, s3.RootCAs, u); status != http.StatusOK {
					t.Fatalf("GET of the presigned URL: %d %s", status, full)
				}
			}
			if tc.format == bootstrapv1.FormatIgnition {
				rendertest.Files(t, tc.format, []byte(stub)) // the stub is valid Ignition too
				if tc.stub == "presigned-url" && !strings.Contains(stub, "certificateAuthorities") {
					t.Errorf("the Ignition stub does not carry the store's CA from ca.crt:\n%s", stub)
				}
			}
			files := rendertest.Files(t, tc.format, full)
			if !strings.Contains(string(kubeadmConfig(files)), "kind: JoinConfiguration") {
				t.Fatalf("the bucket object lacks the join configuration")
			}
			token, err := e.tokenSecretFrom(t, files)
			if err != nil {
				t.Fatal(err)
			}

			// The Machine goes away: object, token and config follow.
			if err := e.Client.Delete(ctx, m); err != nil {
				t.Fatal(err)
			}
			e.WaitFor(t, ns, tc.name+" deleted", func(cs []bootstrapv1.KubeadmConfig) bool {
				return !slices.ContainsFunc(cs, func(c bootstrapv1.KubeadmConfig) bool { return c.Name == tc.name })
			})
			if exists(key) {
				t.Fatal("the bucket object outlived its Machine")
			}
			if err := e.Client.Get(ctx, client.ObjectKeyFromObject(token), &corev1.Secret{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the bootstrap token outlived its Machine: %v", err)
			}
		})
	}
}

// TestAttestedDataHoldsNoSecrets: in attested mode the controller creates
// no token and no CA, and no format of the data holds a private key, a
// bootstrap token or a certificate key, for the init machine and for
// joining control planes and workers alike.
func TestAttestedDataHoldsNoSecrets(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	e.startManager(t, controller.Config{})
	cluster := e.Cluster(t, ns, "c1", false)
	attested := func(format bootstrapv1.Format) bootstrapv1.KubeadmConfigSpec {
		return bootstrapv1.KubeadmConfigSpec{Format: format, Attested: &bootstrapv1.AttestedSpec{Enabled: true, JoinEndpoints: []string{"10.0.0.1:9090"}}}
	}
	if _, _, err := e.Machine(ctx, cluster, "cp-0", true, attested(bootstrapv1.FormatIgnition)); err != nil {
		t.Fatal(err)
	}
	e.WaitFor(t, ns, "attested init data", func(cs []bootstrapv1.KubeadmConfig) bool {
		return len(cs) == 1 && cs[0].Status.DataSecretName != nil
	})
	var caSecrets corev1.SecretList
	if err := e.Client.List(ctx, &caSecrets, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: "c1"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range caSecrets.Items {
		if s.Name != "c1-kubeconfig" && s.Name != "cp-0" {
			t.Errorf("attested init created Secret %s: the CA is made on the attested node", s.Name)
		}
	}

	// The attested node was initialised (gatehouse init); its CA is public.
	e.SeedCA(t, cluster)
	cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	if err := e.Client.Status().Update(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"cp-1", "worker-0", "worker-1"} {
		if _, _, err := e.Machine(ctx, cluster, name, name == "cp-1", attested(formatOf(i))); err != nil {
			t.Fatal(err)
		}
	}
	configs := e.WaitFor(t, ns, "attested data", func(cs []bootstrapv1.KubeadmConfig) bool {
		return len(cs) == 4 && !slices.ContainsFunc(cs, func(c bootstrapv1.KubeadmConfig) bool { return c.Status.DataSecretName == nil })
	})
	token := regexp.MustCompile(`\b[a-z0-9]{6}\.[a-z0-9]{16}\b`)
	for i := range configs {
		c := &configs[i]
		_, text := e.dataFiles(t, c)
		for _, bad := range []string{"PRIVATE KEY", "certificateKey", "certificate-key", "kind: JoinConfiguration", "kind: InitConfiguration"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s (%s) attested data contains %q", c.Name, c.Spec.Format, bad)
			}
		}
		if m := token.FindString(text); m != "" {
			t.Errorf("%s (%s) attested data contains a bootstrap token %q", c.Name, c.Spec.Format, m)
		}
		wantJoin := c.Name != "cp-0"
		if strings.Contains(text, "--join-endpoints 10.0.0.1:9090") != wantJoin || strings.Contains(text, "--cluster-ca-hash sha256:") != wantJoin {
			t.Errorf("%s: join endpoints and CA pin present %v, want %v", c.Name, !wantJoin, wantJoin)
		}
		if strings.Contains(text, "--control-plane") != (c.Name == "cp-1") {
			t.Errorf("%s: --control-plane flag wrong", c.Name)
		}
	}
	// kube-system is shared with the package's other tests: a token of this
	// test's configs names their namespace in its description.
	var secrets corev1.SecretList
	if err := e.Client.List(ctx, &secrets, client.InNamespace(metav1.NamespaceSystem)); err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if strings.Contains(string(s.Data["description"]), " "+ns+"/") {
			t.Errorf("attested mode created Secret %s in kube-system: %s", s.Name, s.Data["description"])
		}
	}
}

// TestAdoptionAndExistingCA: a config made before its Machine owns it waits
// for the owner, and renders once the Machine adopts it (an owner reference
// changes no generation); the init data carries the cluster CA the
// <cluster>-ca Secret already holds instead of a new one.
func TestAdoptionAndExistingCA(t *testing.T) {
	e := newEnv(t)
	ns := e.Namespace(t)
	ctx := t.Context()
	e.startManager(t, controller.Config{})
	cluster := e.Cluster(t, ns, "c1", false)
	e.SeedCA(t, cluster)
	ca := &corev1.Secret{}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-ca"}, ca); err != nil {
		t.Fatal(err)
	}
	m, cfg, err := e.Machine(ctx, cluster, "cp-0", true, bootstrapv1.KubeadmConfigSpec{})
	if err != nil {
		t.Fatal(err)
	}
	// Undo the adoption, as if the config came before the Machine's.
	cfg.OwnerReferences = nil
	if err := e.Client.Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	e.WaitFor(t, ns, "waiting for an owner", func(cs []bootstrapv1.KubeadmConfig) bool {
		return len(cs) == 1 && readyReason(&cs[0]) == controller.ReasonWaitingForOwner
	})
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
		t.Fatal(err)
	}
	cfg.OwnerReferences = []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: m.Name, UID: m.UID}}
	if err := e.Client.Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	configs := e.WaitFor(t, ns, "data after the adoption", func(cs []bootstrapv1.KubeadmConfig) bool {
		return len(cs) == 1 && cs[0].Status.DataSecretName != nil
	})
	files, _ := e.dataFiles(t, &configs[0])
	if got := files["/etc/kubernetes/pki/ca.crt"]; !bytes.Equal(got, ca.Data["tls.crt"]) {
		t.Fatalf("the init data's CA is not the existing c1-ca:\n%s", got)
	}
}
