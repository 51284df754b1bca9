// Command gatehouse-joinservice admits attested nodes into the cluster by
// issuing join tickets over attested TLS. It only wires flags to package
// joinservice (docs/joinservice.md).
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/certexpiry"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/serve"
	"github.com/gatehouse-dev/gatehouse/joinservice"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/csrapprover"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
)

func main() {
	level := new(slog.LevelVar)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := run(log, level); err != nil {
		log.Error("Join service failed", slog.String("error", err.Error()))
		os.Exit(1)
	}
}

func run(log *slog.Logger, level *slog.LevelVar) error {
	var (
		listen         = flag.String("listen", ":9090", "attested TLS gRPC address joiners dial")
		httpListen     = flag.String("http-listen", ":9091", "HTTP address of /metrics, /healthz and /readyz")
		logLevel       = flag.String("log-level", "info", "debug, info, warn or error")
		kubeconfig     = flag.String("kubeconfig", "", "kubeconfig file; empty means the in-cluster service account")
		namespace      = flag.String("namespace", "gatehouse-system", "the service's namespace: join config and deny list ConfigMaps, node-name bindings, the control-plane join Lease")
		joinConfig     = flag.String("join-config", "gatehouse-join-config", "name of the join config ConfigMap")
		denyList       = flag.String("deny-list", "gatehouse-deny-list", "name of the deny list ConfigMap")
		variant        = flag.String("attestation-variant", "tpm", "attestation variant joiners use")
		pkiDir         = flag.String("pki-dir", "/etc/kubernetes/pki", "kubeadm PKI directory: ca.crt/ca.key and the control-plane files")
		keyService     = flag.String("keyservice-endpoint", "gatehouse-keyservice:9000", "key service address, host:port")
		keyServiceCA   = flag.String("keyservice-ca", "", "CA of Gatehouse's internal services (PEM)")
		keyServiceCert = flag.String("keyservice-cert", "", "client certificate for the key service (PEM, CN gatehouse-joinservice)")
		keyServiceKey  = flag.String("keyservice-key", "", "client key for the key service (PEM)")
		rate           = flag.Float64("rate-limit", 1, "requests per second allowed per source address")
		burst          = flag.Int("rate-burst", 10, "requests a source address may make at once")
		maxConns       = flag.Int("max-connections", joinservice.DefaultListenLimits.Total, "open connections at most")
		hsRate         = flag.Float64("handshake-rate", joinservice.DefaultListenLimits.Handshakes.Rate, "new connections (attested handshakes) per second allowed per source address (IPv6: per /64)")
		hsBurst        = flag.Int("handshake-burst", joinservice.DefaultListenLimits.Handshakes.Burst, "new connections a source address may open at once")
		maxSourceConns = flag.Int("max-connections-per-source", joinservice.DefaultListenLimits.PerSource, "open connections per source address at most")
		handshakeTO    = flag.Duration("handshake-timeout", 10*time.Second, "longest attested TLS handshake")
		maxConnAge     = flag.Duration("max-connection-age", 5*time.Minute, "connections close this long after they open; the node attests again on a new one")
		maxConnIdle    = flag.Duration("max-connection-idle", time.Minute, "connections without requests for this long close")
		apiQPS         = flag.Float64("kube-api-qps", 50, "Kubernetes API requests per second")
		apiBurst       = flag.Int("kube-api-burst", 100, "Kubernetes API request burst")
		reattestEvery  = flag.Duration("reattest-interval", continuous.DefaultInterval, "continuous attestation: how often every Node's fresh evidence is verified (±10 %); 0 turns it off (docs/continuous-attestation.md)")
		fetchTimeout   = flag.Duration("reattest-fetch-timeout", continuous.DefaultFetchTimeout, "continuous attestation and CSR approval: the longest one node's evidence fetch and check may take; a node that does not answer in time is Unreachable and delays no other")
		evidencePort   = flag.Int("evidence-port", 9001, "the nodes' evidence endpoint port (gatehouse-bootstrapper serve-evidence)")
		approveCSRs    = flag.Bool("approve-kubelet-csrs", true, "approve kubelet client renewals and serving certificates only after the node's fresh evidence verifies, and remove kubeadm's automatic approval of client renewals (docs/continuous-attestation.md)")
		kubeletCertTTL = flag.Duration("kubelet-cert-lifetime", kubeadm.DefaultKubeletCertLifetime, "lifetime of the kubelet serving certificate a join ticket carries: the cluster's kubeletCertificateLifetime")
	)
	flag.Parse()
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	v, err := attestation.ParseVariant(*variant)
	if err != nil {
		return fmt.Errorf("--attestation-variant: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	restCfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("loading Kubernetes client configuration: %w", err)
	}
	restCfg.QPS, restCfg.Burst = float32(*apiQPS), *apiBurst
	restCfg.Wrap(joinservice.LimitAPIRequests(joinservice.MaxAPIRequestsInFlight))
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating Kubernetes client: %w", err)
	}
	ca, err := clusterpki.LoadCA(filepath.Join(*pkiDir, "ca.crt"), filepath.Join(*pkiDir, "ca.key"))
	if err != nil {
		return err
	}
	keyTLS, err := joinservice.KeyServiceTLSConfig(*keyServiceCert, *keyServiceKey, *keyServiceCA)
	if err != nil {
		return err
	}
	keyConn, err := joinservice.DialKeyService(*keyService, keyTLS)
	if err != nil {
		return err
	}
	defer keyConn.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// When the certificates loaded above expire (docs/operations.md).
	if err := certexpiry.Register(reg, map[string]string{
		"cluster-ca": filepath.Join(*pkiDir, "ca.crt"), "keyservice-client": *keyServiceCert, "keyservice-ca": *keyServiceCA,
	}); err != nil {
		return err
	}
	policy, err := joinservice.NewPolicyStore(v, time.Now, log, reg)
	if err != nil {
		return err
	}
	if err := policy.Watch(ctx, client, *namespace, *joinConfig, *denyList); err != nil {
		return err
	}
	keySource := joinservice.NewKeyServiceKeys(keyConn)
	bindings := nodebinding.New(client, *namespace, time.Now)
	// Every check reads the node's binding and record, and every round the
	// Nodes, from informers' caches rather than the API server
	// (docs/continuous-attestation.md, "Cost"); every credential decision
	// reads the record and the Node (the gate).
	bindingCache := nodebinding.NewCache(client, *namespace)
	records := nodeattestation.NewCache(client, *namespace)
	nodes := continuous.NewNodeCache(client)
	synced := []func(context.Context) error{}
	for _, c := range []interface {
		Start(context.Context)
		WaitForCacheSync(context.Context) error
	}{bindingCache, records, nodes} {
		c.Start(ctx)
		synced = append(synced, c.WaitForCacheSync)
	}
	credentialGate, err := gate.New(policy, records, nodes, log, reg)
	if err != nil {
		return err
	}
	srv, err := joinservice.NewServer(joinservice.Config{
		PolicyStore:         policy,
		Gate:                credentialGate,
		BoundNames:          bindingCache,
		Keys:                keySource,
		Tokens:              joinservice.NewTokens(client, time.Now),
		ControlPlaneLock:    joinservice.NewControlPlaneLock(client, *namespace, joinservice.ControlPlaneJoinTimeout, time.Now),
		Bindings:            bindings,
		CA:                  ca,
		KubeletCertLifetime: *kubeletCertTTL,
		PKIDir:              *pkiDir,
		RateLimit:           connlimit.Rate{Rate: *rate, Burst: *burst},
		Log:                 log,
		Registerer:          reg,
	})
	if err != nil {
		return err
	}
	creds, err := joinservice.ServerCredentials(policy, clusterpki.NewIdentity(ca, time.Now), time.Now)
	if err != nil {
		return err
	}
	grpcServer := joinservice.NewGRPCServer(srv, creds, joinservice.ConnectionLimits{
		HandshakeTimeout: *handshakeTO, MaxAge: *maxConnAge, MaxIdle: *maxConnIdle,
	})
	inner, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *listen, err)
	}
	lis, err := srv.Listen(inner, connlimit.Limits{
		Handshakes: connlimit.Rate{Rate: *hsRate, Burst: *hsBurst}, PerSource: *maxSourceConns, Total: *maxConns,
	})
	if err != nil {
		return fmt.Errorf("connection limits: %w", err)
	}
	if *reattestEvery > 0 || *approveCSRs {
		// Nodes answer only the cluster CA's verifiers: present the join
		// service's own short-lived client certificate, renewed at half
		// its life (docs/continuous-attestation.md, "The evidence
		// endpoint's door").
		// Each node's door connection is kept open between checks, and
		// its session for when the node closed it: a re-verification asks
		// again over it instead of redoing the handshake
		// (docs/continuous-attestation.md, "The evidence endpoint's door").
		fetch := atls.EvidenceFetcher{
			Certificate: clusterpki.NewVerifierIdentity(ca, time.Now).Certificate,
			Sessions:    tls.NewLRUClientSessionCache(atls.DefaultEvidenceSessions),
			Conns:       atls.NewEvidenceConns(atls.DefaultEvidenceSessions),
		}.Fetch
		checker := continuous.NewNodeChecker(policy, bindingCache, fetch, continuous.ClusterID(keySource, policy), *evidencePort)
		events := continuous.NewEventRecorder(ctx, client)
		var loop *continuous.Loop
		if *reattestEvery > 0 {
			if loop, err = continuous.NewLoop(continuous.LoopConfig{
				Client: client, Nodes: nodes, Records: nodeattestation.NewStore(client, *namespace), RecordCache: records,
				Checker: checker, Events: events, Interval: *reattestEvery, FetchTimeout: *fetchTimeout, Log: log, Registerer: reg,
			}); err != nil {
				return err
			}
		}
		var approve func(context.Context) error
		if *approveCSRs {
			approver, err := csrapprover.New(csrapprover.Config{
				Client: client, Checker: checker, Gate: credentialGate, Bindings: bindingCache, Events: events,
				FetchTimeout: *fetchTimeout, Log: log, Registerer: reg,
			})
			if err != nil {
				return err
			}
			approve = approver.Run
		}
		// The pod's name (the chart sets POD_NAME); on the host network
		// the host name is every replica's.
		identity := os.Getenv("POD_NAME")
		if identity == "" {
			if identity, err = os.Hostname(); err != nil {
				return err
			}
		}
		leader, err := continuous.NewLeaderGauge(reg)
		if err != nil {
			return err
		}
		// A replica stands for election only once its caches hold every
		// binding and Node: an empty cache would find every node unbound.
		go func() {
			for _, wait := range synced {
				if wait(ctx) != nil {
					return // only when ctx ends
				}
			}
			continuous.RunElected(ctx, client, *namespace, identity, log, leader, loop, approve)
		}()
	}
	httpServer := &http.Server{Addr: *httpListen, Handler: joinservice.HTTPHandler(srv, reg), ReadHeaderTimeout: 5 * time.Second}
	return serve.Run(ctx, log, "Join service", grpcServer, lis, httpServer, "clusterIdentity", ca.DiscoveryTokenCACertHash())
}
