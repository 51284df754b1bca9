// Command gatehouse-capi-bootstrap is Gatehouse's Cluster API bootstrap
// provider: a controller-runtime manager that turns KubeadmConfigs
// (bootstrap.gatehouse.dev) into Machines' cloud-config or Ignition data
// Secrets. It only wires flags to package capi/controller (docs/capi.md).
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bootstrapv1 "github.com/gatehouse-dev/gatehouse/api/bootstrap/v1alpha1"
	"github.com/gatehouse-dev/gatehouse/capi/basetemplate"
	"github.com/gatehouse-dev/gatehouse/capi/controller"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
	"github.com/gatehouse-dev/gatehouse/internal/buildinfo"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

func main() {
	level := new(slog.LevelVar)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := run(log, level); err != nil {
		log.Error("CAPI bootstrap provider failed", slog.String("error", err.Error()))
		os.Exit(1)
	}
}

func run(log *slog.Logger, level *slog.LevelVar) error {
	var (
		logLevel      = flag.String("log-level", "info", "debug, info, warn or error")
		leaderElect   = flag.Bool("leader-elect", true, "elect a leader so only one replica reconciles")
		leaderNS      = flag.String("leader-election-namespace", "", "namespace of the leader election Lease; empty means the Pod's")
		metricsAddr   = flag.String("metrics-bind-address", ":8443", "address of /metrics; 0 turns it off")
		metricsSecure = flag.Bool("metrics-secure", true, "serve /metrics over HTTPS to callers the API server authenticates and authorizes (get on the non-resource URL /metrics); false serves plain HTTP to anyone")
		metricsCert   = flag.String("metrics-cert-dir", "", "directory with tls.crt and tls.key for /metrics; empty means a self-signed certificate")
		probeAddr     = flag.String("health-probe-bind-address", ":8081", "address of /healthz and /readyz; 0 turns it off")
		concurrency   = flag.Int("concurrency", 10, "KubeadmConfigs reconciled at once")
		tokenTTL      = flag.Duration("bootstrap-token-ttl", controller.DefaultTokenTTL, "lifetime of bootstrap tokens; extended until the node joins")
		namespace     = flag.String("namespace", "", "watch only this namespace; empty means all")
		apiQPS        = flag.Float64("kube-api-qps", 100, "management cluster API requests per second")
		apiBurst      = flag.Int("kube-api-burst", 200, "management cluster API request burst")
		workloadQPS   = flag.Float64("workload-api-qps", 20, "API requests per second to each workload cluster (bootstrap tokens)")
		workloadBurst = flag.Int("workload-api-burst", 40, "API request burst to each workload cluster")
		syncPeriod    = flag.Duration("sync-period", 10*time.Minute, "how often every KubeadmConfig is reconciled anyway")
		printVersion  = flag.Bool("version", false, "print the version and exit")
		mirrorFiles   = flag.String("mirror-files", "", "base URL of a file server mirroring the versions table's downloads as <files>/<original host>/<original path> (docs/install-airgapped.md)")
		mirrorReg     = flag.String("mirror-registry", "", "host[:port][/prefix] of an OCI registry mirroring images as <registry>/<original registry>/<repository>: kubeadm's imageRepository unless a KubeadmConfig sets one")
		templateDir   = flag.String("template-dir", "", "base templates, one per Kubernetes version (<version>/components.yaml): a directory, or s3://BUCKET/PREFIX/ with --template-s3-endpoint and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; a version is supported exactly when its template exists (docs/capi.md, \"Base templates\"); empty: the compiled versions table")
		templateS3    = flag.String("template-s3-endpoint", "s3.amazonaws.com", "host[:port] of the S3 API of an s3:// --template-dir")
		templateS3Reg = flag.String("template-s3-region", "", "region of an s3:// --template-dir's bucket; empty asks the server")
		leaderElectID = "gatehouse-capi-bootstrap.bootstrap.gatehouse.dev"
	)
	flag.Parse()
	if *printVersion {
		fmt.Println(buildinfo.Read().Version)
		return nil
	}
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if *concurrency < 1 {
		return errors.New("--concurrency must be at least 1")
	}
	if *tokenTTL < time.Minute {
		return errors.New("--bootstrap-token-ttl must be at least 1m")
	}
	var mirrored *mirror.Mirror
	if *mirrorFiles != "" || *mirrorReg != "" {
		mirrored = &mirror.Mirror{Files: *mirrorFiles, Registry: *mirrorReg}
		if err := mirrored.Validate(); err != nil {
			return fmt.Errorf("--mirror-files, --mirror-registry: %w", err)
		}
	}
	templates, err := templateSource(*templateDir, *templateS3, *templateS3Reg)
	if err != nil {
		return fmt.Errorf("--template-dir: %w", err)
	}
	// controller-runtime and client-go (leader election, klog) both log
	// through slog as JSON.
	logger := logr.FromSlogHandler(log.Handler())
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)

	// --kubeconfig is controller-runtime's flag (it registers it on the
	// default FlagSet when imported; defining it again panics):
	// ctrl.GetConfig reads it, else KUBECONFIG, else the in-cluster config.
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading the management cluster's kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst, cfg.UserAgent = float32(*apiQPS), *apiBurst, "gatehouse-capi-bootstrap/"+buildinfo.Read().Version

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, bootstrapv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	// Only Cluster API's Secrets are cached (CAs, kubeconfigs, data
	// Secrets, all labelled with their cluster), not every Secret.
	clusterSecrets, err := labels.NewRequirement(clusterv1.ClusterNameLabel, selection.Exists, nil)
	if err != nil {
		return err
	}
	cacheOpts := cache.Options{
		SyncPeriod: syncPeriod,
		ByObject:   map[client.Object]cache.ByObject{&corev1.Secret{}: {Label: labels.NewSelector().Add(*clusterSecrets)}},
	}
	if *namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{*namespace: {}}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   cacheOpts,
		Client:                  client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.ConfigMap{}}}},
		Metrics:                 metricsOptions(*metricsAddr, *metricsSecure, *metricsCert),
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        leaderElectID,
		LeaderElectionNamespace: *leaderNS,
		// The new leader takes over as soon as the old one stops cleanly.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}
	r := controller.New(controller.Config{
		Client:     mgr.GetClient(),
		APIReader:  mgr.GetAPIReader(),
		LockClient: mgr.GetClient(),
		Workload:   controller.NewKubeconfigClients(mgr.GetClient(), mgr.GetAPIReader(), float32(*workloadQPS), *workloadBurst),
		TokenTTL:   *tokenTTL,
		Templates:  templates,
		Mirror:     mirrored,
	})
	if err := r.SetupWithManager(mgr, *concurrency); err != nil {
		return fmt.Errorf("setting up the KubeadmConfig controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	log.Info("Starting the CAPI bootstrap provider", slog.String("version", buildinfo.Read().Version),
		slog.Bool("leaderElection", *leaderElect), slog.Int("concurrency", *concurrency))
	return mgr.Start(ctrl.SetupSignalHandler())
}

// templateSource is the base templates of --template-dir: nil (the
// versions table) when empty, a bucket for s3://BUCKET/PREFIX/ (credentials
// from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), else a directory.
func templateSource(dir, endpoint, region string) (basetemplate.Source, error) {
	switch {
	case dir == "":
		return nil, nil
	case strings.HasPrefix(dir, "s3://"):
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(dir, "s3://"), "/")
		store, err := userdatastore.New(userdatastore.Config{Endpoint: endpoint, Bucket: bucket, Region: region,
			AccessKeyID: os.Getenv("AWS_ACCESS_KEY_ID"), SecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY")})
		if err != nil {
			return nil, err
		}
		return basetemplate.NewBucket(store, prefix)
	}
	return basetemplate.NewDir(dir)
}

// metricsOptions serves /metrics. Secure, it takes HTTPS and checks every
// caller with the API server (TokenReview, SubjectAccessReview), as
// kubebuilder's scaffolding does.
func metricsOptions(addr string, secure bool, certDir string) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: addr, SecureServing: secure, CertDir: certDir}
	if secure {
		opts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return opts
}
