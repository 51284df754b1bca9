package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	recoveryservicev1 "github.com/gatehouse-dev/gatehouse/api/recoveryservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// recoveryServer serves RecoveryService on a rebooted node with an
// initialised state disk (docs/recovery.md): the caller, who holds the
// master secret, sends this node's state disk key and the measurement
// secret. A key that does not open the disk changes nothing; a right one
// takes the node lock with the cluster ID and unlocks the node as a rejoin
// does. Keys are tested against the disk without a lock, beside those of
// other sources (each costs a cryptsetup run, tens of milliseconds); a
// source tests one key at a time and backs off after wrong keys
// (SecretAttemptLimits). Only what follows a right key is serialised.
type recoveryServer struct {
	recoveryservicev1.UnimplementedRecoveryServiceServer
	cfg      Config
	attempts *secretAttempts
	// mu serialises taking the node lock and unlocking the node.
	mu sync.Mutex
	// done receives the outcome once the node lock was taken: nil, or a
	// *FailedError.
	done chan error

	uuidMu sync.Mutex
	uuid   string // the state disk's, once read
}

func newRecoveryServer(cfg Config) (*recoveryServer, error) {
	limits := cfg.RecoveryAttempts
	if limits == (SecretAttemptLimits{}) {
		limits = DefaultSecretAttemptLimits
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	attempts, err := newSecretAttempts(limits, now, cfg.Registerer, recoverAttemptMetric)
	if err != nil {
		return nil, fmt.Errorf("recovery server: %w", err)
	}
	return &recoveryServer{cfg: cfg, attempts: attempts, done: make(chan error, 1)}, nil
}

// GetRecoveryInfo returns the state disk's UUID, read once: anyone who
// attests can ask, and a read costs a cryptsetup run.
func (s *recoveryServer) GetRecoveryInfo(ctx context.Context, _ *recoveryservicev1.GetRecoveryInfoRequest) (*recoveryservicev1.GetRecoveryInfoResponse, error) {
	s.uuidMu.Lock()
	defer s.uuidMu.Unlock()
	if s.uuid == "" {
		uuid, err := s.cfg.Machine.Disk.UUID(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "reading the state disk's UUID: %v", err)
		}
		s.uuid = uuid
	}
	return &recoveryservicev1.GetRecoveryInfoResponse{DiskUuid: s.uuid}, nil
}

// Recover checks the key against the state disk and unlocks the node.
// Errors: InvalidArgument for a malformed request or a key that does not
// open the disk; ResourceExhausted while the caller's source backs off
// after wrong keys or has another key being tested; FailedPrecondition
// once the node holds its node lock. Errors never contain the keys.
func (s *recoveryServer) Recover(ctx context.Context, req *recoveryservicev1.RecoverRequest) (*recoveryservicev1.RecoverResponse, error) {
	if len(req.GetStateDiskKey()) != keys.StateDiskKeySize || len(req.GetMeasurementSecret()) != keys.MeasurementSecretSize {
		return nil, status.Errorf(codes.InvalidArgument, "state disk key and measurement secret must have %d and %d bytes",
			keys.StateDiskKeySize, keys.MeasurementSecretSize)
	}
	log := s.cfg.Machine.Log
	source := ""
	if p, ok := peer.FromContext(ctx); ok {
		source = connlimit.Source(p.Addr)
	}
	if s.cfg.Lock.Locked() {
		return nil, status.Error(codes.FailedPrecondition, "this node already holds its node lock (it rejoined or was recovered in this boot)")
	}
	if reason, wait := s.attempts.begin(source); reason != "" {
		log.Warn("Recovery refused before testing the key", "source", source, "reason", reason, "retryAfter", wait.Round(time.Millisecond).String())
		return nil, status.Error(codes.ResourceExhausted, "too many recovery keys tried ("+reason+"); "+retryHint(reason, wait))
	}
	ok, err := s.cfg.Disk.TestKey(ctx, req.GetStateDiskKey())
	if err != nil {
		s.attempts.abandon(source)
		return nil, status.Errorf(codes.Internal, "testing the key against the state disk: %v", err)
	}
	if !ok {
		s.attempts.wrong(source)
		log.Warn("Recovery refused: the key does not open the state disk", "source", source)
		return nil, status.Error(codes.InvalidArgument, "the key does not open this node's state disk: it must be derived for this node's "+
			"attested identity and disk UUID from the cluster's master secret (gatehouse recover does)")
	}
	s.attempts.right(source)
	if err := s.recover(ctx, req); err != nil {
		return nil, err
	}
	log.Info("Recovered: the state disk is unlocked and the kubelet runs", "source", source)
	return &recoveryservicev1.RecoverResponse{}, nil
}

// recover takes the node lock with the cluster ID derived from req's
// measurement secret and unlocks the node, one caller at a time; the key
// opens the disk. It returns gRPC errors.
func (s *recoveryServer) recover(ctx context.Context, req *recoveryservicev1.RecoverRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg := s.cfg
	salt, err := cfg.Disk.MeasurementSalt(ctx)
	if err != nil {
		return status.Errorf(codes.Internal, "reading the measurement salt: %v", err)
	}
	id, err := keys.DeriveClusterID(req.GetMeasurementSecret(), salt)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if err := cfg.Lock.TryLock("recover", id); err != nil {
		if errors.Is(err, nodelock.ErrLocked) {
			return status.Error(codes.FailedPrecondition, "this node rejoined or was recovered meanwhile")
		}
		return status.Errorf(codes.Internal, "%v", err)
	}
	outcome := s.unlock(ctx, req.GetStateDiskKey())
	s.done <- outcome
	if outcome != nil {
		return status.Errorf(codes.Internal, "%v", outcome)
	}
	return nil
}

// unlock puts the node's state on the state disk and restarts the kubelet, past the node
// lock: failures are recorded as *FailedError. Unlike a failed join, the
// disk is not marked for reset: it holds what the recovery is for (a
// control plane's etcd data), and the next boot can be recovered again.
func (s *recoveryServer) unlock(ctx context.Context, key []byte) error {
	cfg := s.cfg
	fail := func(err error) error {
		failed := &FailedError{Err: err}
		cfg.Machine.Log.Error("Recovery failed after the node lock; reboot the node to try again", "error", err.Error())
		cfg.Machine.recordStatus(bootstrapstatus.PhaseFailed, failed, cfg.Now())
		return failed
	}
	if err := cfg.Machine.unlockState(ctx, key); err != nil {
		return fail(err)
	}
	// After an outage longer than the kubelet certificate lifetime, a
	// control plane renews its kubelet's credentials with the cluster CA;
	// a worker gets them at its next rejoin through a join service.
	if cfg.Machine.kubeletClientExpiring(cfg.Now()) {
		if err := renewKubeletCredentials(cfg.Machine, "", cfg.Now()); err != nil {
			cfg.Machine.Log.Warn("Reboot this worker once a join service runs: it gets new kubelet credentials as it rejoins", "error", err.Error())
		}
	}
	if err := cfg.Kubelet.Restart(ctx); err != nil {
		return fail(fmt.Errorf("restarting the kubelet: %w", err))
	}
	if err := cfg.Machine.syncState(); err != nil {
		return fail(err)
	}
	cfg.Machine.recordStatus(bootstrapstatus.PhaseDone, nil, cfg.Now())
	return nil
}
