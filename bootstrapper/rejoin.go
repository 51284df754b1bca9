package bootstrapper

import (
	"context"
	"errors"
	"fmt"
	"time"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
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
	machine.recordStatus(bootstrapstatus.PhaseRejoining, nil, cfg.Now())
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
		// The kubelet's credentials can only be checked once the state
		// disk is open, after the node lock, when the join service no
		// longer answers: ask for a bootstrap token now, used only if they
		// expired.
		ticket, err = client.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: diskUUID, RenewKubeletCredentialsFor: machine.Node.Name})
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
	if machine.kubeletClientExpiring(cfg.Now()) {
		if err := renewKubeletCredentials(machine, ticket.GetKubeletBootstrapToken(), cfg.Now()); err != nil {
			return machine.markFailed(err, cfg.Now())
		}
	}
	if err := cfg.Kubelet.Restart(ctx); err != nil {
		return machine.markFailed(err, cfg.Now())
	}
	if err := machine.syncState(); err != nil {
		return machine.markFailed(err, cfg.Now())
	}
	machine.recordStatus(bootstrapstatus.PhaseDone, nil, cfg.Now())
	machine.Log.Info("Rejoined: the state disk is unlocked and the kubelet runs")
	return nil
}

// renewKubeletCredentials renews the kubelet's expired client
// certificate (the node was off for longer than the kubelet certificate
// lifetime): a control plane signs a new one with the cluster CA; a worker
// writes the bootstrap kubeconfig with token, which the kubelet requests a
// new certificate with.
func renewKubeletCredentials(machine *Machine, token string, now time.Time) error {
	if signed, err := machine.signKubeletClient(now); signed || err != nil {
		machine.Log.Info("The kubelet's client certificate has expired; signed a new one with the cluster CA", "error", fmt.Sprint(err))
		return err
	}
	if token == "" {
		return errors.New("the kubelet's client certificate has expired, and the join service sent no bootstrap token for a new one")
	}
	machine.Log.Info("The kubelet's client certificate has expired; it requests a new one with the rejoin's bootstrap token")
	return machine.writeBootstrapKubeconfig(token)
}
