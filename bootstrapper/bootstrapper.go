package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	recoveryservicev1 "github.com/gatehouse-dev/gatehouse/api/recoveryservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
)

// bootDisk is the state disk as the boot sequence sees it.
type bootDisk interface {
	stateDisk
	State(ctx context.Context) (statedisk.State, error)
	FormatRandom(ctx context.Context) ([]byte, error)
	MeasurementSalt(ctx context.Context) ([]byte, error)
	TestKey(ctx context.Context, key []byte) (bool, error)
}

// stateVolume puts the node's state on its state disk, opened with key
// (needs device-mapper; *statedisk.Volume), and writes what the node
// wrote there through to the disk (Sync).
type stateVolume interface {
	Unlock(ctx context.Context, key []byte) error
	Sync() error
}

// KubeletService (re)starts the kubelet of a bootstrapped node.
type KubeletService interface {
	Restart(ctx context.Context) error
}

// NoKubelet is for nodes whose kubelet something else supervises (the
// local cluster's node agent): there is nothing to restart.
type NoKubelet struct{}

// Restart does nothing.
func (NoKubelet) Restart(context.Context) error { return nil }

// SystemdKubelet restarts the kubelet.service unit.
type SystemdKubelet struct{}

// Restart runs systemctl restart kubelet.
func (SystemdKubelet) Restart(ctx context.Context) error {
	_, err := runCommand(ctx, "systemctl", "restart", "kubelet.service")
	return err
}

// PIDFileKubelet restarts a kubelet whose supervisor (the local
// cluster's node agent) writes its process ID to Path and starts it
// again when it exits.
type PIDFileKubelet struct {
	Path string
}

// Restart stops the kubelet in Path with SIGTERM and returns once the
// supervisor wrote another process ID there, or ctx ended.
func (k PIDFileKubelet) Restart(ctx context.Context) error {
	old, err := readPID(k.Path)
	if err != nil {
		return fmt.Errorf("the kubelet's process ID: %w", err)
	}
	if err := syscall.Kill(old, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stopping the kubelet (process %d): %w", old, err)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if pid, err := readPID(k.Path); err == nil && pid != old {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the kubelet's supervisor to start it again (%s still names process %d): %w", k.Path, old, ctx.Err())
		case <-tick.C:
		}
	}
}

// readPID reads a process ID file.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s holds no process ID", path)
	}
	return pid, nil
}

// Config holds what Run needs.
type Config struct {
	Machine *Machine
	Lock    *nodelock.Lock
	Disk    bootDisk
	// InitServer serves InitService on InitListener through
	// InitGRPCServer (a gRPC server with attested TLS credentials; both
	// from ListenInitPort, which bounds the port's connections). On a
	// rebooted node the same server and listener serve RecoveryService.
	InitServer     *InitServer
	InitGRPCServer *grpc.Server
	InitListener   net.Listener
	// RecoveryAttempts bound wrong recovery keys per source; zero is
	// DefaultSecretAttemptLimits.
	RecoveryAttempts SecretAttemptLimits
	// Registerer registers gatehouse_bootstrapper_recover_refused_total;
	// nil registers nothing.
	Registerer prometheus.Registerer
	// Join is nil on a node that can only be initialised (no join service
	// to ask, e.g. the first node of a local cluster).
	Join    *JoinClient
	Kubelet KubeletService
	// Linger is how long the InitServer keeps serving after an init ended
	// and no client received the result, so a client whose connection
	// dropped can fetch it; 0 is 10 minutes.
	Linger time.Duration
	// SuccessFile, if set, is written once the node is bootstrapped, e.g.
	// Cluster API's /run/cluster-api/bootstrap-success.complete.
	SuccessFile string
	Now         func() time.Time
}

// Run bootstraps the node and returns when it is done: nil once the node
// was initialised, joined or rejoined; a *FailedError when it failed past
// the node lock; ctx's error when stopped before.
//
//   - Lock already taken (the bootstrapper restarted within this boot): only
//     (re)start the kubelet, unless this boot's bootstrap failed.
//   - State disk initialised (a reboot): rejoin through the join service,
//     while serving RecoveryService on the init address for the case that
//     no join service answers (a full outage; docs/recovery.md). The first
//     of the two to take the node lock decides.
//   - Otherwise: format the state disk with a random passphrase and race the
//     InitServer against the JoinClient for the node lock.
func Run(ctx context.Context, cfg Config) error {
	err := run(ctx, cfg)
	if err == nil && cfg.SuccessFile != "" {
		if werr := cfg.Machine.writeFile(cfg.SuccessFile, []byte("success\n"), 0o644); werr != nil {
			return fmt.Errorf("the node is bootstrapped, but writing %s failed: %w", cfg.SuccessFile, werr)
		}
	}
	return err
}

func run(ctx context.Context, cfg Config) error {
	machine := cfg.Machine
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Linger == 0 {
		cfg.Linger = 10 * time.Minute
	}
	if cfg.Lock.Locked() {
		st, err := bootstrapstatus.Read(machine.Root)
		if err != nil {
			return err
		}
		if st.Phase == bootstrapstatus.PhaseFailed {
			return &FailedError{Err: fmt.Errorf("this boot's bootstrap failed at %s: %s", st.Time.Format(time.RFC3339), st.Error)}
		}
		machine.Log.Info("The node lock is already taken in this boot; (re)starting the kubelet only")
		return cfg.Kubelet.Restart(ctx)
	}
	state, err := cfg.Disk.State(ctx)
	if err != nil {
		return err
	}
	if state == statedisk.Initialised {
		return rejoinOrRecover(ctx, cfg)
	}
	machine.Log.Info("Formatting the state disk with a random passphrase", "previousState", string(state))
	if machine.FirstBootKey, err = cfg.Disk.FormatRandom(ctx); err != nil {
		return err
	}
	machine.recordStatus(bootstrapstatus.PhaseWaiting, nil, cfg.Now())
	return race(ctx, cfg)
}

// rejoinOrRecover unlocks an initialised node: through the join service
// (when it has endpoints), or through RecoveryService served on the init
// listener, whichever takes the node lock first.
func rejoinOrRecover(ctx context.Context, cfg Config) error {
	log := cfg.Machine.Log
	if cfg.Join == nil && cfg.InitGRPCServer == nil {
		return errors.New("the state disk is initialised, but this node has neither join service endpoints to rejoin through nor an address to be recovered on")
	}
	var recovered chan error // nil without a server
	if cfg.InitGRPCServer != nil {
		rs, err := newRecoveryServer(cfg)
		if err != nil {
			return err
		}
		recovered = rs.done
		recoveryservicev1.RegisterRecoveryServiceServer(cfg.InitGRPCServer, rs)
		go func() { _ = cfg.InitGRPCServer.Serve(cfg.InitListener) }()
		defer stopGracefully(cfg.InitGRPCServer)
		log.Info("Serving RecoveryService until the node rejoins or is recovered (gatehouse recover)", "address", cfg.InitListener.Addr().String())
	}
	rejoinCtx, stopRejoin := context.WithCancel(ctx)
	defer stopRejoin()
	var rejoined chan error // nil without join service endpoints
	if cfg.Join != nil {
		rejoined = make(chan error, 1)
		go func() { rejoined <- newRejoin(cfg).run(rejoinCtx) }()
	}
	for {
		select {
		case err := <-rejoined:
			if errors.Is(err, nodelock.ErrLocked) {
				rejoined = nil // the recovery took the lock; its outcome decides
				continue
			}
			return err
		case err := <-recovered:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stopGracefully lets srv finish the calls in flight (the Recover that
// just unlocked the node must reach its caller), for at most 10 s.
func stopGracefully(srv *grpc.Server) {
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
}

// race runs the InitServer and the JoinClient until one of them finishes.
func race(ctx context.Context, cfg Config) error {
	log := cfg.Machine.Log
	initservicev1.RegisterInitServiceServer(cfg.InitGRPCServer, cfg.InitServer)
	serveErr := make(chan error, 1)
	go func() { serveErr <- cfg.InitGRPCServer.Serve(cfg.InitListener) }()
	log.Info("Waiting for init or join", "initAddress", cfg.InitListener.Addr().String())

	joinCtx, stopJoin := context.WithCancel(ctx)
	defer stopJoin()
	var joined chan error // nil without a JoinClient: an init-only node
	if cfg.Join != nil {
		joined = make(chan error, 1)
		go func() { joined <- cfg.Join.Join(joinCtx) }()
	}

	finished := cfg.InitServer.Finished()
	for {
		select {
		case err := <-joined:
			if errors.Is(err, nodelock.ErrLocked) {
				// The InitServer took the lock; its result decides.
				joined = nil
				continue
			}
			cfg.InitGRPCServer.Stop()
			return err
		case <-finished:
			if cfg.Lock.Holder() != "init" {
				// The init ended before the lock (the JoinClient has it, or the
				// request failed early); the join, or another init, decides.
				finished = nil
				continue
			}
			stopJoin()
			err := cfg.InitServer.Result()
			select {
			case <-cfg.InitServer.Delivered():
			case <-time.After(cfg.Linger):
				log.Warn("No client fetched the init result; stopping anyway", "waited", cfg.Linger)
			case <-ctx.Done():
			}
			cfg.InitGRPCServer.GracefulStop()
			if err != nil {
				return &FailedError{Err: err}
			}
			return nil
		case err := <-serveErr:
			stopJoin()
			return fmt.Errorf("serving InitService: %w", err)
		case <-ctx.Done():
			cfg.InitServer.Stop() // a running init job's kubeadm stops too
			cfg.InitGRPCServer.Stop()
			return ctx.Err()
		}
	}
}
