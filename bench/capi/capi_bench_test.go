// Package capi benchmarks Cluster API bootstrap providers: upstream CABPK
// (the kubeadm bootstrap provider of the pinned sigs.k8s.io/cluster-api,
// built by hack/capi-tools.sh) and ours (cmd/gatehouse-capi-bootstrap),
// each turning the same 1000 worker KubeadmConfigs into data Secrets against
// a real kube-apiserver. Run it with bench/capi.sh.
package capi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/utils/ptr"
	cabpkv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gatehousev1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

const (
	// machines is how many worker Machines, each with its KubeadmConfig, a
	// provider turns into data Secrets in one run.
	machines = 1000
	// machinesEnv overrides machines for a quick smoke run of the harness;
	// the numbers of such a run are not the benchmark's.
	machinesEnv = "GATEHOUSE_BENCH_CAPI_MACHINES"
	// createWorkers bounds the concurrency of the setup's creations.
	createWorkers = 16
	// kubernetesVersion is the Machines' spec.version.
	kubernetesVersion = "v1.36.4"
	// clusterName is the Cluster every Machine belongs to.
	clusterName = "bench"
	// pollInterval is how often completion is checked.
	pollInterval = 100 * time.Millisecond
	// runTimeout bounds one provider's run, from its start to the last Secret.
	runTimeout = 10 * time.Minute
)

// Environment variables bench/capi.sh sets.
const (
	// upstreamBinEnv is the upstream CABPK manager (hack/capi-tools.sh).
	upstreamBinEnv = "GATEHOUSE_BENCH_CABPK"
	// gatehouseBinEnv is our provider's manager; default bin/gatehouse-capi-bootstrap.
	gatehouseBinEnv = "GATEHOUSE_BENCH_CAPI_BOOTSTRAP"
	// logDirEnv, when set, is a directory where each provider's log is kept
	// (<provider>.log, overwritten by the next round); else logs are removed.
	logDirEnv = "GATEHOUSE_BENCH_CAPI_LOGDIR"
)

// provider is one bootstrap provider under test. Everything that differs
// between providers is here; the setup, the run and the measurements are
// the same for all.
type provider struct {
	// name names the sub-benchmark and the provider's namespace.
	name string
	// bin returns the provider's manager binary, or "" and why it is
	// missing.
	bin func() (string, string)
	// config is the GroupVersionKind of the provider's KubeadmConfig.
	config schema.GroupVersionKind
	// newConfig returns the provider's KubeadmConfig with the small worker
	// join configuration, not yet owned.
	newConfig func(name string, join cabpkv1.JoinConfiguration) client.Object
	// args returns the manager's flags for the given kubeconfig file; dir is
	// a scratch directory of the run.
	args func(kubeconfig, dir string) ([]string, error)
}

// providers are benchmarked in this order; the later ones report their
// ratios to the first.
var providers = []provider{
	{
		name:   "upstream-cabpk",
		bin:    func() (string, string) { return binFromEnv(upstreamBinEnv, "") },
		config: cabpkv1.GroupVersion.WithKind("KubeadmConfig"),
		newConfig: func(name string, join cabpkv1.JoinConfiguration) client.Object {
			return &cabpkv1.KubeadmConfig{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       cabpkv1.KubeadmConfigSpec{JoinConfiguration: join},
			}
		},
		args: upstreamArgs,
	},
	gatehouseProvider("gatehouse", gatehousev1.FormatCloudConfig),
	gatehouseProvider("gatehouse-ignition", gatehousev1.FormatIgnition),
}

// gatehouseProvider is our manager rendering the given format.
func gatehouseProvider(name string, format gatehousev1.Format) provider {
	return provider{
		name: name,
		bin: func() (string, string) {
			return binFromEnv(gatehouseBinEnv, filepath.Join("..", "..", "bin", "gatehouse-capi-bootstrap"))
		},
		config: gatehousev1.GroupVersion.WithKind("KubeadmConfig"),
		newConfig: func(name string, join cabpkv1.JoinConfiguration) client.Object {
			return &gatehousev1.KubeadmConfig{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       gatehousev1.KubeadmConfigSpec{JoinConfiguration: join, Format: format},
			}
		},
		args: func(kubeconfig, _ string) ([]string, error) {
			return []string{
				"--kubeconfig", kubeconfig,
				"--leader-elect=false",
				"--metrics-bind-address", "0",
				"--health-probe-bind-address", "0",
			}, nil
		},
	}
}

// upstreamArgs are upstream CABPK's flags for a bare API server: no leader
// election, no metrics (diagnostics) or health endpoints. Its webhook server
// cannot be turned off (main.go always registers the KubeadmConfig webhooks
// and controller-runtime then always starts the server, port 0 meaning the
// default 9443), so it gets a throwaway self-signed certificate and a free
// port; the API server never calls it, as no webhook configuration is
// installed. Everything else is upstream's default, as `clusterctl init`
// deploys it: --kubeadmconfig-concurrency=100, --bootstrap-token-ttl=15m,
// --kube-api-qps=100/--kube-api-burst=200, --clustercache-client-qps=20/
// --clustercache-client-burst=30 (the client that creates the bootstrap
// tokens in the workload cluster), log verbosity 2.
func upstreamArgs(kubeconfig, dir string) ([]string, error) {
	certDir := filepath.Join(dir, "webhook-certs")
	if err := writeSelfSignedCert(certDir); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--diagnostics-address=0",
		"--health-addr=0",
		"--webhook-port=" + strconv.Itoa(port),
		"--webhook-cert-dir=" + certDir,
	}, nil
}

// result is one run's measurements.
type result struct {
	wall    time.Duration // from the provider's start to the last data Secret
	cpu     time.Duration // the provider's user and system CPU time
	peakRSS int64         // the provider's VmHWM, bytes
	server  time.Duration // kube-apiserver's and etcd's CPU time in the same span
	tokens  int           // bootstrap token Secrets in kube-system once the provider stopped
}

// BenchmarkReconcile1000 measures how a bootstrap provider turns 1000
// worker KubeadmConfigs into data Secrets. For each provider and round a
// fresh kube-apiserver and etcd (internal/testenv) get the core Cluster API
// CRDs, upstream CABPK's and ours; a namespace with a Cluster whose
// infrastructure is provisioned and control plane initialized, its CA and
// kubeconfig Secrets (the kubeconfig pointing back at the same API server,
// the "workload cluster" where the bootstrap tokens go), and 1000 Machines
// each owning its KubeadmConfig. Then the provider starts as a process of
// its own, and the run lasts until every KubeadmConfig has
// status.dataSecretName and every such Secret exists. It reports the wall
// time from the provider's start, the provider's CPU time and peak RSS
// (VmHWM, read before it is stopped), the CPU time the API server and etcd
// spent meanwhile, and for every provider after the first the ratios of
// its numbers to the first's (ours/upstream). Run it with bench/capi.sh.
func BenchmarkReconcile1000(b *testing.B) {
	// envtest.InstallCRDs logs through controller-runtime; nothing here
	// needs those lines, and unset it warns with a stack trace.
	ctrllog.SetLogger(ctrllog.Log.WithSink(ctrllog.NullLogSink{}))
	n := machineCount(b)
	crdDirs := crdDirectories(b)
	results := map[string]result{}
	for _, p := range providers {
		b.Run(p.name, func(b *testing.B) {
			bin, missing := p.bin()
			if bin == "" {
				b.Skipf("skipping provider %s: %s", p.name, missing)
			}
			var sum result
			rounds := 0
			for b.Loop() {
				// The timer runs only from the provider's start to the last
				// data Secret (runProvider), so ns/op is the wall time.
				b.StopTimer()
				r := runProvider(b, p, bin, crdDirs, n)
				b.StartTimer()
				sum.wall += r.wall
				sum.cpu += r.cpu
				sum.peakRSS = max(sum.peakRSS, r.peakRSS)
				sum.server += r.server
				sum.tokens += r.tokens
				rounds++
			}
			avg := result{
				wall:    sum.wall / time.Duration(rounds),
				cpu:     sum.cpu / time.Duration(rounds),
				peakRSS: sum.peakRSS,
				server:  sum.server / time.Duration(rounds),
				tokens:  sum.tokens / rounds,
			}
			results[p.name] = avg
			b.ReportMetric(avg.wall.Seconds(), "wall-s")
			b.ReportMetric(float64(n)/avg.wall.Seconds(), "configs/s")
			b.ReportMetric(avg.cpu.Seconds(), "cpu-s")
			b.ReportMetric(float64(avg.peakRSS)/(1<<20), "peak-rss-MiB")
			b.ReportMetric(avg.server.Seconds(), "apiserver+etcd-cpu-s")
			b.ReportMetric(float64(avg.tokens)/float64(n), "tokens/config")
			base, ok := results[providers[0].name]
			if p.name == providers[0].name || !ok {
				return
			}
			b.ReportMetric(avg.wall.Seconds()/base.wall.Seconds(), "wall-vs-"+providers[0].name)
			b.ReportMetric(avg.cpu.Seconds()/base.cpu.Seconds(), "cpu-vs-"+providers[0].name)
			b.ReportMetric(float64(avg.peakRSS)/float64(base.peakRSS), "rss-vs-"+providers[0].name)
		})
	}
	for _, p := range providers {
		if r, ok := results[p.name]; ok {
			b.Logf("%-16s %d configs: wall %6.1fs  cpu %6.1fs  peak RSS %6.1f MiB  apiserver+etcd cpu %6.1fs  tokens %d",
				p.name, n, r.wall.Seconds(), r.cpu.Seconds(), float64(r.peakRSS)/(1<<20), r.server.Seconds(), r.tokens)
		}
	}
}

// runProvider runs one round for p: a fresh environment, the objects, the
// provider until every data Secret exists. The environment is gone when it
// returns.
func runProvider(b *testing.B, p provider, bin string, crdDirs []string, n int) result {
	b.Helper()
	ctx := b.Context()
	env, err := testenv.Start(ctx, testenv.Options{})
	if err != nil {
		b.Fatalf("starting the API server: %v", err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			b.Errorf("stopping the API server: %v", err)
		}
	}()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0 // the setup's creations are not rate limited
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: crdDirs, ErrorIfPathMissing: true}); err != nil {
		b.Fatalf("installing CRDs: %v", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: newScheme(b)})
	if err != nil {
		b.Fatal(err)
	}
	ns := "bench-" + p.name
	setupStart := time.Now()
	createObjects(b, c, env, p, ns, n)
	b.Logf("%s: created the Cluster, its Secrets and %d Machines with KubeadmConfigs in %s",
		p.name, n, time.Since(setupStart).Round(time.Millisecond))

	dir, err := os.MkdirTemp("", "gatehouse-bench-capi-*")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	args, err := p.args(env.KubeconfigPath, dir)
	if err != nil {
		b.Fatal(err)
	}
	w, err := newWaiter(ctx, cfg, p.config, ns)
	if err != nil {
		b.Fatal(err)
	}
	defer w.stop()

	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	restClient := clientset.CoreV1().RESTClient()
	reqsBefore, err := testenv.ReadAPIRequests(ctx, restClient)
	if err != nil {
		b.Fatal(err)
	}
	serverPIDs := env.PIDs()
	serverStart := testenv.ProcessesCPU(b, serverPIDs)
	b.StartTimer()
	started := time.Now()
	proc := testenv.StartProcess(b, p.name, bin, args...)
	defer keepLog(b, p.name, proc)
	err = w.wait(ctx, c, ns, n, proc)
	wall := time.Since(started)
	b.StopTimer()
	if err != nil {
		b.Fatalf("%s: %v", p.name, err)
	}
	// Read before the provider is stopped: a stopping manager's work is not
	// the benchmark's.
	r := result{wall: wall, server: testenv.ProcessesCPU(b, serverPIDs) - serverStart}
	if r.cpu, err = testenv.ProcessCPU(proc.PID()); err != nil {
		b.Fatal(err)
	}
	if r.peakRSS, err = testenv.ProcessPeakRSS(proc.PID()); err != nil {
		b.Fatal(err)
	}
	reqsAfter, err := testenv.ReadAPIRequests(ctx, restClient)
	if err != nil {
		b.Fatal(err)
	}
	proc.Stop()
	reqs := testenv.APIRequests{}
	reqs.Add(reqsBefore, reqsAfter)
	b.Logf("%s: API requests per config (the rig's watch and polls included): %s", p.name, reqs.PerOp(n))
	verifySecrets(b, c, ns, w.secretNames())
	if r.tokens, err = countTokens(ctx, c); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: %d data Secrets in %s (cpu %s, peak RSS %.1f MiB); %d bootstrap token Secrets; %d \"Reconciler error\" log lines",
		p.name, n, wall.Round(time.Millisecond), r.cpu, float64(r.peakRSS)/(1<<20), r.tokens, strings.Count(proc.Log(), "Reconciler error"))
	return r
}

// machineCount is machines, or the smoke-run override.
func machineCount(b *testing.B) int {
	b.Helper()
	v := os.Getenv(machinesEnv)
	if v == "" {
		return machines
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive number", machinesEnv, v)
	}
	b.Logf("%s=%d: a smoke run, not the benchmark's %d machines", machinesEnv, n, machines)
	return n
}

// crdDirectories are the CRDs every environment gets: the core Cluster API
// ones (Cluster, Machine, MachinePool, ... which both providers watch),
// upstream CABPK's and ours.
func crdDirectories(b *testing.B) []string {
	b.Helper()
	core, kubeadmBootstrap := testenv.ClusterAPICRDs(b)
	return []string{core, kubeadmBootstrap, filepath.Join("..", "..", "config", "crd")}
}

func newScheme(b *testing.B) *runtime.Scheme {
	b.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, clusterv1.AddToScheme, cabpkv1.AddToScheme, gatehousev1.AddToScheme,
	} {
		if err := add(s); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// createObjects creates, in namespace ns, what a provider needs to join n
// workers: the Cluster (infrastructure provisioned, control plane
// initialized, its endpoint the API server), the <cluster>-ca Secret (the
// environment's CA certificate and key) and the <cluster>-kubeconfig Secret
// (the administrator's kubeconfig of the same API server), and n Machines,
// each owning the KubeadmConfig its spec.bootstrap.configRef names.
func createObjects(b *testing.B, c client.Client, env *testenv.Env, p provider, ns string, n int) {
	b.Helper()
	ctx := b.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	u, err := url.Parse(env.APIServerURL)
	if err != nil {
		b.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		b.Fatalf("API server URL %s: %v", env.APIServerURL, err)
	}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: clusterName, Namespace: ns},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: u.Hostname(), Port: int32(port)},
		},
	}
	if err := c.Create(ctx, cluster); err != nil {
		b.Fatal(err)
	}
	cluster.Status.Initialization = clusterv1.ClusterInitializationStatus{
		InfrastructureProvisioned: ptr.To(true),
		ControlPlaneInitialized:   ptr.To(true),
	}
	// CABPK v1.14 decides "control plane initialized" by this condition, not
	// by status.initialization.controlPlaneInitialized; both are set.
	cluster.Status.Conditions = []metav1.Condition{{
		Type:               clusterv1.ClusterControlPlaneInitializedCondition,
		Status:             metav1.ConditionTrue,
		Reason:             clusterv1.ClusterControlPlaneInitializedReason,
		LastTransitionTime: metav1.Now(),
	}}
	if err := c.Status().Update(ctx, cluster); err != nil {
		b.Fatal(err)
	}

	// The environment's PKI directory holds its CA key under the name
	// kubeadm uses (testenv: "pki/ ... names kubeadm uses").
	caKey, err := os.ReadFile(filepath.Join(env.Dir, "pki", "ca.key"))
	if err != nil {
		b.Fatalf("reading the environment's CA key: %v", err)
	}
	kubeconfig, err := os.ReadFile(env.KubeconfigPath)
	if err != nil {
		b.Fatal(err)
	}
	clusterLabels := map[string]string{clusterv1.ClusterNameLabel: clusterName}
	for _, s := range []*corev1.Secret{
		{
			// The label matters: CABPK's Secret cache holds only Secrets
			// with it, and it reads these two from that cache.
			ObjectMeta: metav1.ObjectMeta{Name: clusterName + "-ca", Namespace: ns, Labels: clusterLabels},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{"tls.crt": env.CACertPEM, "tls.key": caKey},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: clusterName + "-kubeconfig", Namespace: ns, Labels: clusterLabels},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{"value": kubeconfig},
		},
	} {
		if err := c.Create(ctx, s); err != nil {
			b.Fatal(err)
		}
	}

	join := cabpkv1.JoinConfiguration{
		NodeRegistration: cabpkv1.NodeRegistrationOptions{
			KubeletExtraArgs: []cabpkv1.Arg{{Name: "node-labels", Value: ptr.To("bench.gatehouse.dev/worker=true")}},
		},
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(createWorkers)
	for i := range n {
		g.Go(func() error {
			name := fmt.Sprintf("worker-%04d", i)
			m := &clusterv1.Machine{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: clusterLabels},
				Spec: clusterv1.MachineSpec{
					ClusterName: clusterName,
					Version:     kubernetesVersion,
					Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: p.config.Group, Kind: p.config.Kind, Name: name,
					}},
					// Required by the CRD; neither provider reads it, so it
					// need not exist.
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "BenchMachine", Name: name,
					},
				},
			}
			if err := c.Create(gctx, m); err != nil {
				return fmt.Errorf("creating Machine %s: %w", name, err)
			}
			cfg := p.newConfig(name, join)
			cfg.SetNamespace(ns)
			cfg.SetLabels(clusterLabels)
			cfg.SetOwnerReferences([]metav1.OwnerReference{{
				APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: name, UID: m.UID,
				Controller: ptr.To(true),
			}})
			if err := c.Create(gctx, cfg); err != nil {
				return fmt.Errorf("creating %s %s: %w", p.config.Kind, name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// waiter follows a provider's KubeadmConfigs through a watch (an informer),
// which costs the API server far less than listing 1000 objects per poll,
// and remembers each one's status.dataSecretName.
type waiter struct {
	mu      sync.Mutex
	secrets map[string]string // KubeadmConfig name → status.dataSecretName
	cancel  context.CancelFunc
	done    chan struct{}
}

func newWaiter(ctx context.Context, cfg *rest.Config, gvk schema.GroupVersionKind, ns string) (*waiter, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	gvr := gvk.GroupVersion().WithResource(strings.ToLower(gvk.Kind) + "s")
	inf := dynamicinformer.NewFilteredDynamicInformer(dc, gvr, ns, 0, toolscache.Indexers{}, nil).Informer()
	w := &waiter{secrets: map[string]string{}, done: make(chan struct{})}
	record := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		name, _, _ := unstructured.NestedString(u.Object, "status", "dataSecretName")
		if name == "" {
			return
		}
		w.mu.Lock()
		w.secrets[u.GetName()] = name
		w.mu.Unlock()
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		return nil, err
	}
	ctx, w.cancel = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		inf.Run(ctx.Done())
	}()
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		w.stop()
		return nil, fmt.Errorf("watching %s: cache did not sync", gvr)
	}
	return w, nil
}

func (w *waiter) stop() {
	w.cancel()
	<-w.done
}

// secretNames returns the data Secret names seen so far.
func (w *waiter) secretNames() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]string, len(w.secrets))
	for k, v := range w.secrets {
		out[k] = v
	}
	return out
}

// wait polls until all n KubeadmConfigs have status.dataSecretName and all
// those Secrets exist in ns, the provider exits, or runTimeout passes.
func (w *waiter) wait(ctx context.Context, c client.Client, ns string, n int, proc *testenv.Process) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, runTimeout, true, func(ctx context.Context) (bool, error) {
		if proc.Exited() {
			exit := proc.Wait(ctx)
			if exit == nil {
				exit = errors.New("exit status 0")
			}
			return false, fmt.Errorf("provider exited: %w", exit)
		}
		names := w.secretNames()
		if len(names) < n {
			last = fmt.Sprintf("%d of %d KubeadmConfigs have status.dataSecretName", len(names), n)
			return false, nil
		}
		// Metadata only: existence is the question, and the data is large.
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		exist := make(map[string]bool, len(list.Items))
		for _, s := range list.Items {
			exist[s.Name] = true
		}
		missing := 0
		for _, s := range names {
			if !exist[s] {
				missing++
			}
		}
		last = fmt.Sprintf("all %d KubeadmConfigs have status.dataSecretName, %d of those Secrets missing", n, missing)
		return missing == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last: %s)", err, last)
	}
	return nil
}

// countTokens counts the bootstrap token Secrets in kube-system: a provider
// that reconciles a KubeadmConfig twice from a stale cache makes a second
// token (and rewrites the data Secret), which shows here.
func countTokens(ctx context.Context, c client.Client) (int, error) {
	list := &corev1.SecretList{}
	if err := c.List(ctx, list, client.InNamespace(metav1.NamespaceSystem)); err != nil {
		return 0, err
	}
	n := 0
	for _, s := range list.Items {
		if s.Type == bootstrapapi.SecretTypeBootstrapToken {
			n++
		}
	}
	return n, nil
}

// verifySecrets checks, after the run, that every data Secret holds data.
func verifySecrets(b *testing.B, c client.Client, ns string, names map[string]string) {
	b.Helper()
	list := &corev1.SecretList{}
	if err := c.List(b.Context(), list, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	byName := make(map[string]*corev1.Secret, len(list.Items))
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	for config, secret := range names {
		s, ok := byName[secret]
		switch {
		case !ok:
			b.Fatalf("KubeadmConfig %s: data Secret %s does not exist", config, secret)
		case len(s.Data["value"]) == 0:
			b.Fatalf("KubeadmConfig %s: data Secret %s has no value", config, secret)
		}
	}
}

// keepLog copies the provider's log to $GATEHOUSE_BENCH_CAPI_LOGDIR, when
// set, as <name>.log.
func keepLog(b *testing.B, name string, proc *testenv.Process) {
	if dir := os.Getenv(logDirEnv); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name+".log"), []byte(proc.Log()), 0o600); err != nil {
			b.Errorf("keeping the %s log: %v", name, err)
		}
	}
}

// binFromEnv returns the executable that env names, else def; "" and why
// when it is not there.
func binFromEnv(env, def string) (string, string) {
	path := os.Getenv(env)
	if path == "" {
		path = def
	}
	if path == "" {
		return "", env + " is not set (bench/capi.sh sets it)"
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err.Error()
	}
	info, err := os.Stat(abs)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Sprintf("%s does not exist (set %s, or build it: bench/capi.sh does)", abs, env)
	case err != nil:
		return "", err.Error()
	case info.IsDir() || info.Mode()&0o111 == 0:
		return "", abs + " is not an executable file"
	}
	return abs, ""
}

// freePort returns a TCP port free on all addresses at the time of the call.
func freePort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writeSelfSignedCert writes tls.crt and tls.key, a self-signed certificate
// for localhost, into dir.
func writeSelfSignedCert(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
}
