// Command gatehouse-keyservice serves the cluster's data keys to the join
// service over mutual TLS. It only wires flags to package keyservice.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/credentials"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gatehouse-dev/gatehouse/internal/certexpiry"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kmsplugin"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/serve"
	"github.com/gatehouse-dev/gatehouse/keyservice"
)

func main() {
	level := new(slog.LevelVar)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := run(log, level); err != nil {
		log.Error("Key service failed", slog.String("error", err.Error()))
		os.Exit(1)
	}
}

func run(log *slog.Logger, level *slog.LevelVar) error {
	var (
		listen        = flag.String("listen", ":9000", "gRPC address (mutual TLS)")
		metricsListen = flag.String("metrics-listen", ":9001", "HTTP address of /metrics")
		tlsFiles      keyservice.TLSFiles
		allowed       = flag.String("allowed-clients", "gatehouse-joinservice", "comma-separated client certificate common names allowed to call")
		logLevel      = flag.String("log-level", "info", "debug, info, warn or error")
		kmsCfg        keyservice.KMSConfig
		hsRate        = flag.Float64("handshake-rate", keyservice.DefaultListenLimits.Handshakes.Rate, "new connections per second per source address")
		hsBurst       = flag.Int("handshake-burst", keyservice.DefaultListenLimits.Handshakes.Burst, "new connections a source address may open at once")
		maxSource     = flag.Int("max-connections-per-source", keyservice.DefaultListenLimits.PerSource, "open connections per source address")
		maxConns      = flag.Int("max-connections", keyservice.DefaultListenLimits.Total, "open connections in all")
		pluginSocket  = flag.String("kms-plugin-socket", "", "Unix socket to serve the Kubernetes KMS v2 plugin on (Secrets encrypted in etcd, docs/keys.md); empty: off")
		kekCurrent    = flag.Int("etcd-encryption-generation", 1, "KMS v2 plugin: the KEK generation new DEKs are encrypted with")
		kekOldest     = flag.Int("etcd-encryption-oldest-generation", 1, "KMS v2 plugin: the oldest KEK generation still decrypted")
		printConfig   = flag.Bool("print-encryption-config", false, "print the API server's EncryptionConfiguration for --kms-plugin-socket (default "+kubeadm.KMSPluginSocket+") and exit")
	)
	flag.StringVar(&tlsFiles.Cert, "tls-cert", "", "server certificate (PEM)")
	flag.StringVar(&tlsFiles.Key, "tls-key", "", "server key (PEM)")
	flag.StringVar(&tlsFiles.ClientCA, "client-ca", "", "CA of allowed clients (PEM)")
	flag.StringVar(&kmsCfg.URIFile, "kms-uri-file", "", "file holding a kms:// URI")
	flag.StringVar(&kmsCfg.MasterSecretFile, "master-secret-file", "", "file holding the master secret")
	flag.StringVar(&kmsCfg.SaltFile, "salt-file", "", "file holding the master salt")
	flag.DurationVar(&kmsCfg.CheckInterval, "kms-check-interval", kms.DefaultCheckInterval, "how often an external KMS (aws-kms, vault-transit) unwraps the master secret again; while a check fails no keys are served")
	flag.StringVar(&kmsCfg.Namespace, "namespace", "gatehouse-system", "namespace of wrapped data key Secrets (pkcs11 KMS)")
	flag.Parse()
	if *printConfig {
		socket := *pluginSocket
		if socket == "" {
			socket = kubeadm.KMSPluginSocket
		}
		cfg, err := kubeadm.EncryptionConfiguration(socket)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(cfg)
		return err
	}
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if cfg, err := rest.InClusterConfig(); err == nil {
		if kmsCfg.Client, err = kubernetes.NewForConfig(cfg); err != nil {
			return fmt.Errorf("creating Kubernetes client: %w", err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	keys, closer, err := keyservice.OpenKMS(ctx, kmsCfg, log, reg)
	if err != nil {
		return fmt.Errorf("opening KMS: %w", err)
	}
	defer closer.Close()
	tlsCfg, err := keyservice.ServerTLSConfig(tlsFiles, strings.Split(*allowed, ","))
	if err != nil {
		return err
	}
	// When the certificates loaded above expire (docs/operations.md).
	if err := certexpiry.Register(reg, map[string]string{"keyservice-serving": tlsFiles.Cert, "keyservice-client-ca": tlsFiles.ClientCA}); err != nil {
		return err
	}
	srv, err := keyservice.NewServer(keys, log, reg)
	if err != nil {
		return err
	}
	if *pluginSocket != "" {
		plugin, err := kmsplugin.New(keys, *kekCurrent, *kekOldest, log)
		if err != nil {
			return err
		}
		go func() {
			if err := kmsplugin.Serve(ctx, *pluginSocket, plugin); err != nil {
				log.Error("KMS v2 plugin failed", slog.String("error", err.Error()))
				stop()
			}
		}()
		log.Info("Serving the KMS v2 plugin", slog.String("socket", *pluginSocket), slog.String("keyID", kmsplugin.KeyID(*kekCurrent)))
	}
	grpcServer := keyservice.NewGRPCServer(srv, credentials.NewTLS(tlsCfg))
	inner, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *listen, err)
	}
	lis, err := srv.Listen(inner, connlimit.Limits{
		Handshakes: connlimit.Rate{Rate: *hsRate, Burst: *hsBurst}, PerSource: *maxSource, Total: *maxConns,
	})
	if err != nil {
		return fmt.Errorf("connection limits: %w", err)
	}
	metricsServer := &http.Server{Addr: *metricsListen, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	return serve.Run(ctx, log, "Key service", grpcServer, lis, metricsServer)
}
