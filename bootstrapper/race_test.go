package bootstrapper

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/legacy/tpm2"
	"golang.org/x/crypto/bcrypt"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// memDisk is a state disk in memory, for the race, where the disk is not
// what is tested.
type memDisk struct {
	mu  sync.Mutex
	key []byte
}

func (d *memDisk) UUID(context.Context) (string, error) {
	return "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b", nil
}
func (d *memDisk) Rekey(_ context.Context, _, newKey []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.key = newKey
	return nil
}
func (d *memDisk) MarkInitialised(context.Context, []byte) error { return nil }
func (d *memDisk) MarkForReset(context.Context) error            { return nil }

type noInstaller struct{}

func (noInstaller) Install(context.Context, []*componentsv1.Component) error { return nil }

// TestInitJoinRace has the real InitServer (an init job) and the real
// JoinClient (a join ticket over attested TLS from a join service) race
// for the node lock 1000 times, each round on a freshly reset TPM: exactly
// one wins every round, the other stops with the lock taken, and PCR 15
// holds the winner's cluster ID.
func TestInitJoinRace(t *testing.T) {
	const rounds = 1000
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	ca, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	machine := &Machine{
		Root: t.TempDir(), Disk: &memDisk{}, FirstBootKey: []byte("first boot"), Installer: noInstaller{},
		Kubeadm: &dryRunRunner{t: t, recordOnly: true},
		Node:    kubeadm.Node{Name: "node-1", AdvertiseAddress: "192.0.2.10"},
		Log:     slog.New(slog.DiscardHandler),
	}
	secret := random(t, 32)
	hash, err := bcrypt.GenerateFromPassword(secret, bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	master, masterSalt := random(t, 32), random(t, 32)
	req := &initservicev1.InitRequest{
		InitSecret: secret, KmsUri: kms.ClusterKMSURIString(master, masterSalt), MeasurementSalt: random(t, 32),
		KubernetesVersion: "v1.36.4", KubernetesComponents: []*componentsv1.Component{component(t, machine.Root, "kubelet", "k")},
		ClusterName: "gatehouse", ServiceCidr: "10.96.0.0/12", PodCidr: "10.244.0.0/16",
	}
	ticket := testTicket(t, machine.Root)
	ticket.DiscoveryTokenCaCertHash = ca.DiscoveryTokenCACertHash()
	joinID, err := keys.DeriveClusterID(ticket.GetMeasurementSecret(), ticket.GetMeasurementSalt())
	if err != nil {
		t.Fatal(err)
	}

	var service string
	fake := &fakeJoinService{ca: ca, ticket: ticket}
	wins := map[string]int{}
	for round := range rounds {
		// A power cycle: PCRs back to zero, transient keys gone.
		if err := sim.Reset(); err != nil {
			t.Fatal(err)
		}
		if _, err := tpmattester.MeasureBoot(sim, bootArtefacts); err != nil {
			t.Fatal(err)
		}
		attester, err := tpmattester.New(sim, tpmattester.Options{PCRs: testPCRs})
		if err != nil {
			t.Fatal(err)
		}
		lock, err := nodelock.New(sim)
		if err != nil {
			t.Fatal(err)
		}
		n := &testNode{sim: sim, attester: attester, lock: lock, machine: machine}
		if service == "" {
			// The AK comes from the same seed every round: one service serves all.
			service = startJoinService(t, n, fake)
		}
		initServer, err := NewInitServer(InitServerConfig{Machine: machine, Lock: lock, Identity: n.identity(t), InitSecretHash: hash, BindName: (&nameBindings{}).bind})
		if err != nil {
			t.Fatal(err)
		}
		join := newJoinClient(t, n, ca.DiscoveryTokenCACertHash(), false, service)

		// The init starts as the join service hands out the ticket, so both
		// reach the lock at about the same time.
		var wg sync.WaitGroup
		var joinErr error
		ticketSent := make(chan struct{})
		var once sync.Once
		fake.mu.Lock()
		fake.onIssue = func() { once.Do(func() { close(ticketSent) }) }
		fake.mu.Unlock()
		var plan *initPlan
		wg.Go(func() {
			<-ticketSent
			// What Init does first: check the request.
			var err error
			if plan, err = initServer.plan(req); err != nil {
				t.Error(err)
				return
			}
			if _, err := initServer.attach(plan); err != nil {
				return // the join already holds the lock: refused up front
			}
			<-initServer.Finished()
		})
		wg.Go(func() {
			joinErr = join.Join(t.Context())
			once.Do(func() { close(ticketSent) }) // no ticket: let the init go
		})
		wg.Wait()
		_ = attester.Close()

		initWon := initServer.job != nil && initServer.Result() == nil
		joinWon := joinErr == nil
		if initWon == joinWon {
			t.Fatalf("round %d: init won %v, join won %v (join error %v): want exactly one winner", round, initWon, joinWon, joinErr)
		}
		want := joinID
		if initWon {
			want = plan.clusterID
			if !errors.Is(joinErr, nodelock.ErrLocked) {
				t.Fatalf("round %d: the losing join ended with %v, want ErrLocked", round, joinErr)
			}
		}
		pcr, err := tpm2.ReadPCR(sim, keys.NodeLockPCR, tpm2.AlgSHA256)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(pcr, keys.ExpectedNodeLockPCR(want)) {
			t.Fatalf("round %d: PCR 15 does not hold the winner's cluster ID", round)
		}
		wins[lock.Holder()]++
	}
	t.Logf("wins over %d rounds: %v", rounds, wins)
}
