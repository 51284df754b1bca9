package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"

	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// bootDisk is the state disk as the boot sequence sees it.
type bootDisk interface {
	stateDisk
	State(ctx context.Context) (statedisk.State, error)
	FormatRandom(ctx context.Context) ([]byte, error)
	MeasurementSalt(ctx context.Context) ([]byte, error)
}

// diskOpener maps the unlocked state disk (needs device-mapper).
type diskOpener interface {
	Open(ctx context.Context, name string, key []byte) error
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

// Config holds what Run needs.
type Config struct {
	Setup *Setup
	Lock  *nodelock.Lock
	Disk  bootDisk
	// Opener, when set, maps the state disk as MapperName once its key is
	// known after a reboot. Nil on machines without device-mapper.
	Opener     diskOpener
	MapperName string
	// Init serves InitService on InitListener through InitServer (a gRPC
	// server with attested TLS credentials).
	Init         *InitServer
	InitServer   *grpc.Server
	InitListener net.Listener
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
//   - State disk initialised (a reboot): rejoin through the join service.
//   - Otherwise: format the state disk with a random passphrase and race the
//     InitServer against the JoinClient for the node lock.
func Run(ctx context.Context, cfg Config) error {
	err := run(ctx, cfg)
	if err == nil && cfg.SuccessFile != "" {
		if werr := cfg.Setup.writeFile(cfg.SuccessFile, []byte("success\n"), 0o644); werr != nil {
			return fmt.Errorf("the node is bootstrapped, but writing %s failed: %w", cfg.SuccessFile, werr)
		}
	}
	return err
}

func run(ctx context.Context, cfg Config) error {
	setup := cfg.Setup
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Linger == 0 {
		cfg.Linger = 10 * time.Minute
	}
	if cfg.Lock.Locked() {
		st, err := ReadStatus(setup.Root)
		if err != nil {
			return err
		}
		if st.Phase == PhaseFailed {
			return &FailedError{Err: fmt.Errorf("this boot's bootstrap failed at %s: %s", st.Time.Format(time.RFC3339), st.Error)}
		}
		setup.Log.Info("The node lock is already taken in this boot; (re)starting the kubelet only")
		return cfg.Kubelet.Restart(ctx)
	}
	state, err := cfg.Disk.State(ctx)
	if err != nil {
		return err
	}
	if state == statedisk.Initialised {
		if cfg.Join == nil {
			return errors.New("the state disk is initialised, but without join service endpoints this node cannot rejoin")
		}
		return rejoin(ctx, cfg)
	}
	setup.Log.Info("Formatting the state disk with a random passphrase", "previousState", string(state))
	if setup.FirstBootKey, err = cfg.Disk.FormatRandom(ctx); err != nil {
		return err
	}
	_ = writeStatus(setup.Root, PhaseWaiting, nil, cfg.Now())
	return race(ctx, cfg)
}

// race runs the InitServer and the JoinClient until one of them finishes.
func race(ctx context.Context, cfg Config) error {
	log := cfg.Setup.Log
	initservicev1.RegisterInitServiceServer(cfg.InitServer, cfg.Init)
	serveErr := make(chan error, 1)
	go func() { serveErr <- cfg.InitServer.Serve(cfg.InitListener) }()
	log.Info("Waiting for init or join", "initAddress", cfg.InitListener.Addr().String())

	joinCtx, stopJoin := context.WithCancel(ctx)
	defer stopJoin()
	var joined chan error // nil without a JoinClient: an init-only node
	if cfg.Join != nil {
		joined = make(chan error, 1)
		go func() { joined <- cfg.Join.Join(joinCtx) }()
	}

	finished := cfg.Init.Finished()
	for {
		select {
		case err := <-joined:
			if errors.Is(err, nodelock.ErrLocked) {
				// The InitServer took the lock; its result decides.
				joined = nil
				continue
			}
			cfg.InitServer.Stop()
			return err
		case <-finished:
			if cfg.Lock.Holder() != "init" {
				// The init ended before the lock (the JoinClient has it, or the
				// request failed early); the join, or another init, decides.
				finished = nil
				continue
			}
			stopJoin()
			err := cfg.Init.Result()
			select {
			case <-cfg.Init.Delivered():
			case <-time.After(cfg.Linger):
				log.Warn("No client fetched the init result; stopping anyway", "waited", cfg.Linger)
			case <-ctx.Done():
			}
			cfg.InitServer.GracefulStop()
			if err != nil {
				return &FailedError{Err: err}
			}
			return nil
		case err := <-serveErr:
			stopJoin()
			return fmt.Errorf("serving InitService: %w", err)
		case <-ctx.Done():
			cfg.InitServer.Stop()
			return ctx.Err()
		}
	}
}

// rejoin unlocks an initialised node after a reboot: the join service
// returns the disk key and the measurement secret after attestation.
func rejoin(ctx context.Context, cfg Config) error {
	setup := cfg.Setup
	_ = writeStatus(setup.Root, PhaseRejoining, nil, cfg.Now())
	diskUUID, err := setup.Disk.UUID(ctx)
	if err != nil {
		return err
	}
	salt, err := cfg.Disk.MeasurementSalt(ctx)
	if err != nil {
		return err
	}
	var ticket *joinservicev1.IssueRejoinTicketResponse
	err = cfg.Join.retry(ctx, "rejoin ticket", func(ctx context.Context, client joinservicev1.JoinServiceClient) error {
		var err error
		ticket, err = client.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: diskUUID})
		return err
	})
	if err != nil {
		return err
	}
	id, err := keys.DeriveClusterID(ticket.GetMeasurementSecret(), salt)
	if err != nil {
		return err
	}
	if err := cfg.Lock.TryLock("rejoin", id); err != nil {
		return err
	}
	if cfg.Opener != nil {
		if err := cfg.Opener.Open(ctx, cfg.MapperName, ticket.GetStateDiskKey()); err != nil {
			return cfg.Join.fail(err)
		}
	}
	if err := cfg.Kubelet.Restart(ctx); err != nil {
		return cfg.Join.fail(err)
	}
	_ = writeStatus(setup.Root, PhaseDone, nil, cfg.Now())
	setup.Log.Info("Rejoined: the state disk is unlocked and the kubelet runs")
	return nil
}
