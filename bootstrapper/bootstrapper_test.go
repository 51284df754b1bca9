package bootstrapper

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

type fakeKubelet struct{ restarts atomic.Int32 }

func (k *fakeKubelet) Restart(context.Context) error {
	k.restarts.Add(1)
	return nil
}

// runFixture wires Run for a test node: an InitServer on a loopback
// listener with attested TLS, and a JoinClient to the given endpoints.
type runFixture struct {
	node    *testNode
	cfg     Config
	kubelet *fakeKubelet
	secret  []byte
	ca      *clusterpki.CA
}

func newRunFixture(t *testing.T, n *testNode, ca *clusterpki.CA, endpoints ...string) *runFixture {
	t.Helper()
	f := &runFixture{node: n, kubelet: &fakeKubelet{}, secret: random(t, 32), ca: ca}
	hash, err := bcrypt.GenerateFromPassword(f.secret, bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	init, err := NewInitServer(InitServerConfig{Machine: n.machine, Lock: n.lock, Identity: n.identity(t), InitSecretHash: hash, BindName: (&nameBindings{}).bind})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := atls.NewCredentials(atls.Config{Attester: n.attester})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.cfg = Config{
		Machine: n.machine, Lock: n.lock, Disk: n.disk,
		InitServer: init, InitGRPCServer: grpc.NewServer(grpc.Creds(creds)), InitListener: lis,
		Join:    newJoinClient(t, n, ca.DiscoveryTokenCACertHash(), false, endpoints...),
		Kubelet: f.kubelet, Linger: time.Minute,
	}
	return f
}

func (f *runFixture) run(ctx context.Context) chan error {
	done := make(chan error, 1)
	go func() { done <- Run(ctx, f.cfg) }()
	return done
}

// initClient dials the node's InitServer as the CLI does; lockedOK
// accepts a node whose lock is taken (the CLI would refuse it).
func (f *runFixture) initClient(t *testing.T, lockedOK bool) initservicev1.InitServiceClient {
	t.Helper()
	return initservicev1.NewInitServiceClient(dial(t, f.cfg.InitListener.Addr().String(),
		atls.Config{Verifiers: []attestation.Verifier{verifier(t, f.node.attester, lockedOK)}}))
}

func (f *runFixture) initRequest(t *testing.T) *initservicev1.InitRequest {
	return &initservicev1.InitRequest{
		InitSecret: f.secret, KmsUri: kms.ClusterKMSURIString(random(t, 32), random(t, 32)),
		MeasurementSalt: random(t, 32), KubernetesVersion: "v1.36.4",
		KubernetesComponents: []*componentsv1.Component{component(t, f.node.machine.Root, "kubelet", "kubelet")},
		ClusterName:          "gatehouse", ServiceCidr: "10.96.0.0/12", PodCidr: "10.244.0.0/16",
	}
}

func awaitRun(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("Run did not return")
		return nil
	}
}

// TestRunJoinWins: the join service answers; the JoinClient takes the lock
// and joins, an Init arriving meanwhile is refused, and Run returns.
func TestRunJoinWins(t *testing.T) {
	ca, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t)
	n.runner.recordOnly = true
	ticket := testTicket(t, n.machine.Root)
	ticket.DiscoveryTokenCaCertHash = ca.DiscoveryTokenCACertHash()
	addr := startJoinService(t, n, &fakeJoinService{ca: ca, ticket: ticket})
	f := newRunFixture(t, n, ca, addr)
	var initErr error
	n.runner.onRun = func(args []string) {
		// kubeadm join runs: the lock is the JoinClient's, and a CLI
		// attesting the node would already refuse it for its PCR 15.
		stream, err := f.initClient(t, true).Init(t.Context(), f.initRequest(t))
		if err == nil {
			_, err = stream.Recv()
		}
		initErr = err
	}
	f.cfg.SuccessFile = "/run/cluster-api/bootstrap-success.complete"
	if err := awaitRun(t, f.run(t.Context())); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(n.machine.Root, f.cfg.SuccessFile)); err != nil {
		t.Fatalf("the success file was not written: %v", err)
	}
	if status.Code(initErr) != codes.FailedPrecondition {
		t.Fatalf("Init during the join: %v, want FailedPrecondition", initErr)
	}
	if n.lock.Holder() != "join" || n.runner.subcommands() != "join" {
		t.Fatalf("holder %q, kubeadm %q", n.lock.Holder(), n.runner.subcommands())
	}
	if st, _ := n.disk.State(t.Context()); st != statedisk.Initialised {
		t.Fatalf("disk state %s", st)
	}
}

// TestRunInitWins: no join service answers; the CLI's Init takes the lock,
// the JoinClient stops, and Run returns once the result was delivered.
func TestRunInitWins(t *testing.T) {
	ca, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t)
	n.runner.recordOnly = true
	f := newRunFixture(t, n, ca, "127.0.0.1:1")
	done := f.run(t.Context())
	stream, err := f.initClient(t, false).Init(t.Context(), f.initRequest(t))
	if err != nil {
		t.Fatal(err)
	}
	_, final, err := receive(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if final.GetSuccess() == nil {
		t.Fatalf("init: %v", final)
	}
	if err := awaitRun(t, done); err != nil {
		t.Fatal(err)
	}
	if n.lock.Holder() != "init" || n.runner.subcommands() != "init,token" {
		t.Fatalf("holder %q, kubeadm %q", n.lock.Holder(), n.runner.subcommands())
	}
}

// TestRunLockedRestartsKubeletOnly: a bootstrapper restarted in the same
// boot finds the lock taken and only restarts the kubelet, unless this
// boot's bootstrap failed.
func TestRunLockedRestartsKubeletOnly(t *testing.T) {
	ca, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t)
	if err := n.lock.TryLock("join", random(t, 32)); err != nil {
		t.Fatal(err)
	}
	f := newRunFixture(t, n, ca, "127.0.0.1:1")
	if err := awaitRun(t, f.run(t.Context())); err != nil {
		t.Fatal(err)
	}
	if f.kubelet.restarts.Load() != 1 || n.runner.subcommands() != "" {
		t.Fatalf("kubelet restarts %d, kubeadm %q: want one restart and nothing else", f.kubelet.restarts.Load(), n.runner.subcommands())
	}
	if st, _ := n.disk.State(t.Context()); st != statedisk.Unformatted {
		t.Fatalf("the disk was touched: %s", st)
	}

	if err := writeStatus(n.machine.Root, PhaseFailed, errors.New("kubeadm join failed"), time.Now()); err != nil {
		t.Fatal(err)
	}
	var failed *FailedError
	if err := awaitRun(t, f.run(t.Context())); !errors.As(err, &failed) {
		t.Fatalf("after a failed bootstrap: %v, want a FailedError", err)
	}
	if f.kubelet.restarts.Load() != 1 {
		t.Fatal("the kubelet of a failed node was restarted")
	}
}

// TestRunRejoin: after a reboot (PCR 15 zero, disk initialised) the node
// gets its disk key through the join service, locks with the same cluster
// ID as before and restarts the kubelet.
func TestRunRejoin(t *testing.T) {
	ca, n, ticket := rebootedNode(t)
	addr := startJoinService(t, n, &fakeJoinService{ca: ca, ticket: ticket})
	f := newRunFixture(t, n, ca, addr)
	vol := &recordingVolume{}
	n.machine.State = vol
	if err := awaitRun(t, f.run(t.Context())); err != nil {
		t.Fatal(err)
	}
	vol.unlockedWith(t, ticket.GetStateDiskKey())
	id, err := keys.DeriveClusterID(ticket.GetMeasurementSecret(), ticket.GetMeasurementSalt())
	if err != nil {
		t.Fatal(err)
	}
	pcr, err := tpm2.ReadPCR(n.sim, keys.NodeLockPCR, tpm2.AlgSHA256)
	if err != nil || !bytes.Equal(pcr, keys.ExpectedNodeLockPCR(id)) || n.lock.Holder() != "rejoin" {
		t.Fatalf("holder %q, PCR 15 %x", n.lock.Holder(), pcr)
	}
	if f.kubelet.restarts.Load() != 1 || n.runner.subcommands() != "" {
		t.Fatal("rejoin must only restart the kubelet")
	}
}
