package bootstrapper

import (
	"context"
	"errors"
	"fmt"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// rejoin unlocks an initialised node after a reboot: the join service
// returns the disk key and the measurement secret after attestation, the
// node lock is taken with the cluster ID they give, the state disk is
// opened and the kubelet restarted.
type rejoin struct {
	cfg   Config
	calls *joinServiceCalls
}

// newRejoin returns the rejoin of a node with cfg, which has a JoinClient
// (its join service calls are the rejoin's).
func newRejoin(cfg Config) *rejoin { return &rejoin{cfg: cfg, calls: cfg.Join.calls} }

// run rejoins; errors after the node lock are *FailedError.
func (r *rejoin) run(ctx context.Context) error {
	cfg := r.cfg
	machine := cfg.Machine
	machine.recordStatus(PhaseRejoining, nil, cfg.Now())
	diskUUID, err := machine.Disk.UUID(ctx)
	if err != nil {
		return err
	}
	salt, err := cfg.Disk.MeasurementSalt(ctx)
	if err != nil {
		return err
	}
	var ticket *joinservicev1.IssueRejoinTicketResponse
	err = r.calls.call(ctx, "rejoin ticket", func(ctx context.Context, client joinservicev1.JoinServiceClient) error {
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
	// The key must open this disk before anything changes (where
	// device-mapper is missing, this is the only proof of it).
	if ok, err := cfg.Disk.TestKey(ctx, ticket.GetStateDiskKey()); err != nil {
		return fmt.Errorf("testing the rejoin ticket's key against the state disk: %w", err)
	} else if !ok {
		return errors.New("the join service's state disk key does not open this node's state disk; the node stays locked out")
	}
	if err := cfg.Lock.TryLock("rejoin", id); err != nil {
		return err
	}
	if err := machine.unlockState(ctx, ticket.GetStateDiskKey()); err != nil {
		return machine.markFailed(err, cfg.Now())
	}
	if err := cfg.Kubelet.Restart(ctx); err != nil {
		return machine.markFailed(err, cfg.Now())
	}
	machine.recordStatus(PhaseDone, nil, cfg.Now())
	machine.Log.Info("Rejoined: the state disk is unlocked and the kubelet runs")
	return nil
}
