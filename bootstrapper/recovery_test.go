package bootstrapper

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	recoveryservicev1 "github.com/gatehouse-dev/gatehouse/api/recoveryservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// rebootedNode returns a node as after a reboot: its state disk
// initialised with ticket's key and salt, PCR 15 zero; and a cluster CA.
func rebootedNode(t *testing.T) (*clusterpki.CA, *testNode, *joinservicev1.IssueJoinTicketResponse) {
	t.Helper()
	ca, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t)
	n.formatDisk(t)
	ticket := testTicket(t, n.machine.Root)
	if err := n.machine.rekeyDisk(t.Context(), ticket.GetStateDiskKey(), ticket.GetMeasurementSalt()); err != nil {
		t.Fatal(err)
	}
	return ca, n, ticket
}

// TestRunRecover: a rebooted node whose join service is down serves
// RecoveryService over attested TLS. It names its disk; a key that does
// not open the disk (or is malformed) changes nothing; the right key and
// measurement secret take the node lock with the cluster ID, restart the
// kubelet and end Run; a second attempt is refused.
func TestRunRecover(t *testing.T) {
	ca, n, ticket := rebootedNode(t)
	f := newRunFixture(t, n, ca, "127.0.0.1:1") // the join service is down
	vol := &recordingVolume{}
	n.machine.State = vol
	done := f.run(t.Context())
	client := recoveryservicev1.NewRecoveryServiceClient(dial(t, f.cfg.InitListener.Addr().String(),
		atls.Config{Verifiers: []attestation.Verifier{verifier(t, n.attester)}}))
	ctx := t.Context()

	info, err := client.GetRecoveryInfo(ctx, &recoveryservicev1.GetRecoveryInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if uuid, _ := n.disk.UUID(ctx); info.GetDiskUuid() != uuid {
		t.Fatalf("disk UUID %q, want %q", info.GetDiskUuid(), uuid)
	}
	for name, req := range map[string]*recoveryservicev1.RecoverRequest{
		"a key that does not open the disk": {StateDiskKey: random(t, keys.StateDiskKeySize), MeasurementSecret: ticket.GetMeasurementSecret()},
		"a short key":                       {StateDiskKey: ticket.GetStateDiskKey()[:16], MeasurementSecret: ticket.GetMeasurementSecret()},
		"no measurement secret":             {StateDiskKey: ticket.GetStateDiskKey()},
	} {
		_, err := client.Recover(ctx, req)
		if status.Code(err) != codes.InvalidArgument || bytes.Contains([]byte(err.Error()), ticket.GetStateDiskKey()) {
			t.Fatalf("%s: %v, want InvalidArgument", name, err)
		}
		if n.lock.Locked() {
			t.Fatalf("%s: the node lock was taken", name)
		}
		if st, _ := n.disk.State(ctx); st != statedisk.Initialised {
			t.Fatalf("%s: the disk is %s", name, st)
		}
	}
	if logs := n.logs.String(); !strings.Contains(logs, "Recovery refused: the key does not open the state disk") ||
		strings.Contains(logs, hex.EncodeToString(ticket.GetStateDiskKey())) || strings.Contains(logs, base64.StdEncoding.EncodeToString(ticket.GetStateDiskKey())) {
		t.Fatalf("the node's log does not record the refusal, or holds a key:\n%s", logs)
	}
	right := &recoveryservicev1.RecoverRequest{StateDiskKey: ticket.GetStateDiskKey(), MeasurementSecret: ticket.GetMeasurementSecret()}
	if _, err := client.Recover(ctx, right); err != nil {
		t.Fatal(err)
	}
	if err := awaitRun(t, done); err != nil {
		t.Fatal(err)
	}
	vol.unlockedWith(t, ticket.GetStateDiskKey())
	id, err := keys.DeriveClusterID(ticket.GetMeasurementSecret(), ticket.GetMeasurementSalt())
	if err != nil {
		t.Fatal(err)
	}
	pcr, err := tpm2.ReadPCR(n.sim, keys.NodeLockPCR, tpm2.AlgSHA256)
	if err != nil || !bytes.Equal(pcr, keys.ExpectedNodeLockPCR(id)) || n.lock.Holder() != "recover" {
		t.Fatalf("holder %q, PCR 15 %x (%v)", n.lock.Holder(), pcr, err)
	}
	if f.kubelet.restarts.Load() != 1 || n.runner.subcommands() != "" {
		t.Fatalf("kubelet restarts %d, kubeadm %q: recovery must only restart the kubelet", f.kubelet.restarts.Load(), n.runner.subcommands())
	}
	if st, _ := bootstrapstatus.Read(n.machine.Root); st.Phase != bootstrapstatus.PhaseDone {
		t.Fatalf("status %s, want done", st.Phase)
	}
	// A second recovery of a node that holds its lock changes nothing.
	again, err := newRecoveryServer(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Recover(ctx, right); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("recovering a locked node: %v, want FailedPrecondition", err)
	}
	if f.kubelet.restarts.Load() != 1 {
		t.Fatal("a second recovery restarted the kubelet")
	}
}

// TestRunRejoinRefusesAKeyThatDoesNotOpenTheDisk: a rejoin ticket whose
// disk key does not open the state disk (a wrong or impersonated join
// service) leaves the node as it was: no node lock, no kubelet.
func TestRunRejoinRefusesAKeyThatDoesNotOpenTheDisk(t *testing.T) {
	ca, n, _ := rebootedNode(t)
	wrong := testTicket(t, n.machine.Root) // another key
	addr := startJoinService(t, n, &fakeJoinService{ca: ca, ticket: wrong})
	f := newRunFixture(t, n, ca, addr)
	f.cfg.InitGRPCServer = nil // rejoin only
	err := awaitRun(t, f.run(t.Context()))
	if err == nil || !strings.Contains(err.Error(), "does not open this node's state disk") {
		t.Fatalf("Run = %v, want the key refused", err)
	}
	if n.lock.Locked() || f.kubelet.restarts.Load() != 0 {
		t.Fatalf("locked %t, kubelet restarts %d: want neither", n.lock.Locked(), f.kubelet.restarts.Load())
	}
}
