// Command gatehouse-bootstrapper turns a new machine into a Kubernetes node:
// it serves InitService (the first control plane) and runs the JoinClient
// (every other node) until one of them takes the node lock, then exits.
// `gatehouse-bootstrapper serve-evidence` instead serves the node's fresh
// evidence to verifiers such as `gatehouse verify` for as long as it runs.
// It only wires flags to package bootstrapper (docs/bootstrapper.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/installer"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/choose"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/cloudmeta"
)

// Exit codes: 1 for errors before the node lock (systemd retries), 2 for
// a failure after it (the node must be reset; retrying cannot help).
const (
	exitError  = 1
	exitFailed = 2
)

func main() {
	level := new(slog.LevelVar)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if len(os.Args) > 1 && os.Args[1] == "serve-evidence" {
		if err := serveEvidence(log, os.Args[2:]); err != nil {
			log.Error("Serving evidence failed", slog.String("error", err.Error()))
			os.Exit(exitError)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "serve-kms" {
		if err := serveKMS(log, os.Args[2:]); err != nil {
			log.Error("Serving the KMS v2 plugin failed", slog.String("error", err.Error()))
			os.Exit(exitError)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "serve-upgrade" {
		if err := serveUpgrade(log, os.Args[2:]); err != nil {
			log.Error("Serving the upgrade agent failed", slog.String("error", err.Error()))
			os.Exit(exitError)
		}
		return
	}
	if err := run(log, level); err != nil {
		log.Error("Bootstrap failed", slog.String("error", err.Error()))
		var failed *bootstrapper.FailedError
		if errors.As(err, &failed) {
			os.Exit(exitFailed)
		}
		os.Exit(exitError)
	}
}

func run(log *slog.Logger, level *slog.LevelVar) error {
	hostname, _ := os.Hostname()
	o, err := parseFlags(os.Args[0], os.Args[1:], hostname)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	} else if err != nil {
		return err
	}
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	facts := machineFacts{cmdline: func() ([]byte, error) { return os.ReadFile("/proc/cmdline") }, defaultRoute: defaultRouteAddress, cloud: openCloud}
	resolveCtx, cancelResolve := context.WithTimeout(context.Background(), time.Minute)
	err = resolveFromMachine(resolveCtx, o, facts)
	cancelResolve()
	if err != nil {
		return err
	}
	if o.cloudProvider != nil {
		log.Info("Took the node's identity from its cloud's instance metadata", "cloud", o.cloudProvider.Name(),
			"node", o.node.Name, "address", o.node.AdvertiseAddress, "providerID", o.node.ProviderID)
	}
	if o.endpoints == nil {
		log.Warn("No join service endpoints: this node can only be initialised (gatehouse init)")
	}
	hash, err := readInitSecretHash(log, o.initSecretHashFile)
	if err != nil {
		return err
	}
	if hash == nil && o.cloudProvider != nil {
		if hash, err = cloudInitSecretHash(log, o); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	node, err := choose.OpenAttester(o.attester)
	if err != nil {
		return err
	}
	defer node.Close()
	logEndorsement(log, node.TPMAttester, node.Attester)
	logTCGEventLog(log, node.TCGEventLog)
	lock, err := nodelock.New(node.TPM)
	if err != nil {
		return err
	}
	disk, err := statedisk.New(o.stateDisk)
	if err != nil {
		return err
	}
	machine, err := newMachine(log, o, disk, statedisk.DeviceMapperAvailable)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	initServer, err := newInitServer(o, machine, lock, node.TPMAttester, hash, reg)
	if err != nil {
		return err
	}
	join, err := newJoinClient(o, machine, lock, node.Attester)
	if err != nil {
		return err
	}
	lis, initGRPC, err := listenInit(log, o, node.Attester, reg)
	if err != nil {
		return err
	}
	if o.metricsListen != "" {
		go serveMetrics(log, o.metricsListen, reg)
	}
	return bootstrapper.Run(ctx, bootstrapper.Config{
		Machine: machine, Lock: lock, Disk: disk,
		InitServer: initServer, InitGRPCServer: initGRPC, InitListener: lis,
		RecoveryAttempts: o.secretAttempts, Registerer: reg,
		Join: join, Kubelet: o.kubeletService, SuccessFile: o.successFile,
	})
}

// newMachine is the node the bootstrapper sets up: its root, state disk,
// installer, kubeadm and kubelet. The node's state lives on the opened
// state disk; a kernel without device-mapper (deviceMapper says why) is
// refused, unless --insecure-state-on-root-fs keeps the state on the root
// file system for a local network-namespace cluster (docs/bootstrapper.md,
// "State disk").
func newMachine(log *slog.Logger, o *options, disk *statedisk.Disk, deviceMapper func() (bool, string)) (*bootstrapper.Machine, error) {
	m := &bootstrapper.Machine{
		Root:        o.root,
		Disk:        disk,
		Installer:   installer.New(installer.Options{Log: log}),
		Kubeadm:     bootstrapper.ExecKubeadm{Path: o.kubeadmPath},
		Node:        o.node,
		Kubelet:     o.kubelet,
		Log:         log,
		KubeletLogs: bootstrapper.JournalKubeletLogs,

		ContainerdHostsDir: o.containerdHostsDir,
	}
	ok, why := deviceMapper()
	switch {
	case ok:
		m.State = &statedisk.Volume{Disk: disk, MapperName: o.mapperName, MountPoint: o.stateMount, Dirs: statedisk.StateDirs, Log: log}
	case o.insecureStateOnRootFS:
		log.Warn("The state disk will not be opened (--insecure-state-on-root-fs): the node's state stays unencrypted on the root file system", "reason", why)
	default:
		return nil, fmt.Errorf("refusing to bootstrap: the node's state disk cannot be opened because %s, so its keys, certificates and etcd data would stay unencrypted on the root file system; boot a kernel with device-mapper and dm-crypt (the Gatehouse node image has them), or, for a local network-namespace cluster only, pass --insecure-state-on-root-fs", why)
	}
	return m, nil
}

// newInitServer serves InitService for the first control plane, and
// RecoveryService once the node is one.
func newInitServer(o *options, machine *bootstrapper.Machine, lock *nodelock.Lock, tpm *tpmattester.QuoteAttester, hash []byte, reg prometheus.Registerer) (*bootstrapper.InitServer, error) {
	identity, err := tpm.Identity()
	if err != nil {
		return nil, err
	}
	return bootstrapper.NewInitServer(bootstrapper.InitServerConfig{
		Machine: machine, Lock: lock, Identity: identity, InitSecretHash: hash,
		BindName:        bootstrapper.BindNodeName,
		SecretAttempts:  o.secretAttempts,
		Registerer:      reg,
		ImageRepository: o.imageRepository, SkipPhases: o.skipPhases,
		KubeProxy: o.kubeProxy, ControlPlaneEnv: o.controlPlaneEnv, ControlPlaneWait: o.controlPlaneWait,
		LeaderElectionLease: o.leaderElectionLease, EncryptSecrets: o.encryptSecrets,
	})
}

// newJoinClient joins the cluster through the join service; nil without
// endpoints.
func newJoinClient(o *options, machine *bootstrapper.Machine, lock *nodelock.Lock, attester attestation.Attester) (*bootstrapper.JoinClient, error) {
	if o.endpoints == nil {
		return nil, nil
	}
	return bootstrapper.NewJoinClient(bootstrapper.JoinClientConfig{
		Machine: machine, Lock: lock, Endpoints: o.endpoints, Attester: attester,
		CACertHash: o.caHash, ControlPlane: o.controlPlane, Backoff: o.joinBackoff,
	})
}

// listenInit listens for InitService with attested TLS. Each anonymous
// handshake costs a TPM quote: connections are limited per source before
// any attestation work, and idle ones are closed.
func listenInit(log *slog.Logger, o *options, attester attestation.Attester, reg prometheus.Registerer) (net.Listener, *grpc.Server, error) {
	creds, err := atls.NewCredentials(atls.Config{Attester: attester})
	if err != nil {
		return nil, nil, err
	}
	inner, err := net.Listen("tcp", o.initListen)
	if err != nil {
		return nil, nil, fmt.Errorf("listening for InitService: %w", err)
	}
	return bootstrapper.ListenInitPort(inner, bootstrapper.InitPortConfig{Creds: creds, Log: log, Registerer: reg, Limits: o.initPort})
}

// serveMetrics serves reg on addr until the process ends; the bootstrapper
// is short-lived, so a failure is logged, not fatal.
func serveMetrics(log *slog.Logger, addr string, reg *prometheus.Registry) {
	srv := &http.Server{Addr: addr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		log.Error("Serving metrics failed", "listen", addr, "error", err.Error())
	}
}

// logEndorsement says how verifiers can trust the node's attestation key.
func logEndorsement(log *slog.Logger, a *tpmattester.QuoteAttester, node attestation.Attester) {
	identity, _ := a.Identity()
	if v := node.Variant(); v != attestation.VariantTPM {
		log.Info("Evidence is the vTPM's quote with the hardware report binding its key", "variant", v, "identity", identity)
		return
	}
	if a.RequestsActivation() {
		log.Info("Evidence carries the TPM's EK certificate: verifiers trusting its manufacturer (ekRoots) need no registered key", "identity", identity)
		return
	}
	log.Info("Evidence carries no EK certificate: verifiers must pin this attestation key (pinnedAKs)", "identity", identity)
}

// readInitSecretHash reads the bcrypt hash of the init secret from path.
// A node provisioned without one (no file: a worker image, or a node that
// joins) gets nil and refuses every Init; it can still join, rejoin and be
// recovered.
func readInitSecretHash(log *slog.Logger, path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("No init secret hash: this node cannot be initialised, only joined, rejoined or recovered", "file", path)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the init secret hash: %w", err)
	}
	return []byte(strings.TrimSpace(string(data))), nil
}

// cloudInitSecretHash reads the init secret's bcrypt hash from the
// instance's metadata; nil when the key is not set there.
func cloudInitSecretHash(log *slog.Logger, o *options) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := o.cloudProvider.InitSecretHash(ctx, o.cloudInitSecretKey)
	switch {
	case errors.Is(err, cloudmeta.ErrNotSet):
		log.Info("No init secret hash in the instance's metadata either: this node cannot be initialised, only joined, rejoined or recovered", "key", o.cloudInitSecretKey)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the init secret hash from the cloud's metadata: %w", err)
	}
	return []byte(h), nil
}

// logTCGEventLog says, once at start, whether evidence carries the
// firmware's TCG event log.
func logTCGEventLog(log *slog.Logger, path string) {
	if path == "" {
		log.Info("Evidence carries no TCG event log: --tcg-event-log names no file that exists; verifiers whose policy requires one (requireEventLog) refuse this node")
		return
	}
	log.Info("Evidence carries the TCG event log, read afresh for each", "path", path)
}
