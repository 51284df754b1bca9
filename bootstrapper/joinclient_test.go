package bootstrapper

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kmsplugin"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// fakeJoinService answers over real attested TLS with a cluster identity,
// as the join service does, with scripted tickets.
type fakeJoinService struct {
	joinservicev1.UnimplementedJoinServiceServer
	ca *clusterpki.CA

	mu          sync.Mutex
	unavailable int        // answer the first calls Unavailable
	busy        int        // then the next ones Unavailable with a RetryInfo of 10 ms
	refuse      codes.Code // if set, refuse every call with it
	calls       int
	ticket      *joinservicev1.IssueJoinTicketResponse
	// onIssue, if set, runs as a join ticket is returned.
	onIssue func()
	// renewedFor lists the node names rejoin tickets renewed kubelet
	// credentials for; they carry rejoinToken.
	renewedFor []string
}

const rejoinToken = "abcdef.0123456789abcdef"

func (s *fakeJoinService) answer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.refuse != codes.OK {
		return status.Error(s.refuse, "refused by the test")
	}
	if s.unavailable > 0 {
		s.unavailable--
		return status.Error(codes.Unavailable, "try again")
	}
	if s.busy > 0 {
		s.busy--
		st, err := status.New(codes.Unavailable, "another control plane is joining").
			WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(10 * time.Millisecond)})
		if err != nil {
			return err
		}
		return st.Err()
	}
	return nil
}

func (s *fakeJoinService) IssueJoinTicket(_ context.Context, req *joinservicev1.IssueJoinTicketRequest) (*joinservicev1.IssueJoinTicketResponse, error) {
	if err := s.answer(); err != nil {
		return nil, err
	}
	kubelet, err := clusterpki.ParseKubeletCSR(req.GetCertificateRequest())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	cert, err := s.ca.SignKubelet(kubelet, time.Now(), 0)
	if err != nil {
		return nil, err
	}
	t := proto.CloneOf(s.ticket)
	t.KubeletCert = cert
	s.mu.Lock()
	onIssue := s.onIssue
	s.mu.Unlock()
	if onIssue != nil {
		onIssue()
	}
	return t, nil
}

func (s *fakeJoinService) IssueRejoinTicket(_ context.Context, req *joinservicev1.IssueRejoinTicketRequest) (*joinservicev1.IssueRejoinTicketResponse, error) {
	if err := s.answer(); err != nil {
		return nil, err
	}
	resp := &joinservicev1.IssueRejoinTicketResponse{StateDiskKey: s.ticket.GetStateDiskKey(), MeasurementSecret: s.ticket.GetMeasurementSecret()}
	if node := req.GetRenewKubeletCredentialsFor(); node != "" {
		s.mu.Lock()
		s.renewedFor = append(s.renewedFor, node)
		s.mu.Unlock()
		resp.KubeletBootstrapToken = rejoinToken
	}
	return resp, nil
}

// startJoinService serves fake for n's attester, signed by ca, and returns
// its address.
func startJoinService(t *testing.T, n *testNode, fake *fakeJoinService) string {
	t.Helper()
	creds, err := atls.NewCredentials(atls.Config{
		Verifiers:   []attestation.Verifier{verifier(t, n.attester)},
		Certificate: clusterpki.NewIdentity(fake.ca, time.Now).Certificate,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	joinservicev1.RegisterJoinServiceServer(srv, fake)
	return serve(t, srv)
}

func testTicket(t *testing.T, root string) *joinservicev1.IssueJoinTicketResponse {
	t.Helper()
	return &joinservicev1.IssueJoinTicketResponse{
		StateDiskKey:         random(t, 32),
		MeasurementSecret:    random(t, 32),
		MeasurementSalt:      random(t, 32),
		ApiServerEndpoint:    "192.0.2.1:6443",
		Token:                "abcdef.0123456789abcdef",
		KubernetesVersion:    "v1.36.4",
		KubernetesComponents: []*componentsv1.Component{component(t, root, "kubelet", "kubelet v1.36.4")},
	}
}

func newJoinClient(t *testing.T, n *testNode, caHash string, controlPlane bool, endpoints ...string) *JoinClient {
	t.Helper()
	c, err := NewJoinClient(JoinClientConfig{
		Machine: n.machine, Lock: n.lock, Endpoints: StaticEndpoints(endpoints), Attester: n.attester,
		CACertHash: caHash, ControlPlane: controlPlane, Backoff: Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createToken creates a bootstrap token in env and waits until the
// bootstrap signer has signed cluster-info with it.
func createToken(t *testing.T, env *testenv.Env) string {
	t.Helper()
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	token, err := testenv.CreateBootstrapToken(t.Context(), client, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := strings.Cut(token, ".")
	if err := testenv.WaitClusterInfoSigned(t.Context(), client, id); err != nil {
		t.Fatal(err)
	}
	return token
}

// TestJoin: a worker finds the join service on its second endpoint,
// retries an Unavailable answer, verifies the service by the CA pin, takes
// the lock with the ticket's cluster ID, re-keys its disk, installs the
// components and runs the real kubeadm join (dry run), whose discovery
// checks the ticket's token and CA hash against the real API server.
func TestJoin(t *testing.T) {
	env := testenv.New(t, testenv.Options{ControllerManager: true})
	if err := env.PublishClusterInfo(t.Context()); err != nil {
		t.Fatal(err)
	}
	ca, err := clusterpki.LoadCA(filepath.Join(env.Dir, "pki", "ca.crt"), filepath.Join(env.Dir, "pki", "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t)
	n.formatDisk(t)
	first := n.machine.FirstBootKey
	ticket := testTicket(t, n.machine.Root)
	ticket.ApiServerEndpoint = strings.TrimPrefix(env.APIServerURL, "https://")
	ticket.Token = createToken(t, env)
	ticket.DiscoveryTokenCaCertHash = ca.DiscoveryTokenCACertHash()
	fake := &fakeJoinService{ca: ca, ticket: ticket, unavailable: 1}
	addr := startJoinService(t, n, fake)

	client := newJoinClient(t, n, ca.DiscoveryTokenCACertHash(), false, "127.0.0.1:1", addr)
	if err := client.Join(t.Context()); err != nil {
		t.Fatalf("join: %v\nlogs:\n%s", err, n.logs)
	}
	if fake.calls != 2 {
		t.Errorf("%d calls to the join service, want 2 (one Unavailable)", fake.calls)
	}
	id, err := keys.DeriveClusterID(ticket.GetMeasurementSecret(), ticket.GetMeasurementSalt())
	if err != nil {
		t.Fatal(err)
	}
	pcr, err := tpm2.ReadPCR(n.sim, keys.NodeLockPCR, tpm2.AlgSHA256)
	if err != nil || !bytes.Equal(pcr, keys.ExpectedNodeLockPCR(id)) || n.lock.Holder() != "join" {
		t.Fatalf("lock holder %q, PCR 15 %x: want the join's cluster ID", n.lock.Holder(), pcr)
	}
	ctx := t.Context()
	if ok, _ := n.disk.TestKey(ctx, first); ok {
		t.Error("the first-boot passphrase still opens the disk")
	}
	if ok, _ := n.disk.TestKey(ctx, ticket.GetStateDiskKey()); !ok {
		t.Error("the ticket's disk key does not open the disk")
	}
	if salt, err := n.disk.MeasurementSalt(ctx); err != nil || !bytes.Equal(salt, ticket.GetMeasurementSalt()) {
		t.Errorf("recorded measurement salt: %v", err)
	}
	root := n.machine.Root
	if got := fileMode(t, filepath.Join(root, "usr/local/bin/kubelet")); got != 0o755 {
		t.Errorf("kubelet installed with mode %v", got)
	}
	if cert := servingCert(t, root); cert.Subject.CommonName != "system:node:node-1" {
		t.Errorf("kubelet certificate for %s", cert.Subject)
	}
	if _, err := os.Stat(filepath.Join(root, kubeadmDir, "join.yaml")); !os.IsNotExist(err) {
		t.Error("the join configuration (it holds the token) was not removed")
	}
	if got := n.runner.subcommands(); got != "join" {
		t.Errorf("kubeadm subcommands %q, want join", got)
	}
	if st, _ := bootstrapstatus.Read(root); st.Phase != bootstrapstatus.PhaseDone {
		t.Errorf("status %+v", st)
	}
	testkit.AssertNoSecrets(t, n.logs.String(), [][]byte{[]byte(ticket.GetToken()), ticket.GetStateDiskKey(), ticket.GetMeasurementSecret()})
}

// joinFixture is a fresh node whose kubeadm is only recorded, a ticket for
// it, and a fake join service that hands it out to the fixture's client.
type joinFixture struct {
	n      *testNode
	ticket *joinservicev1.IssueJoinTicketResponse
	fake   *fakeJoinService
	client *JoinClient
}

// newJoinFixture makes the fixture; prepare, when set, changes the node,
// ticket or service before the service starts.
func newJoinFixture(t *testing.T, controlPlane bool, prepare func(*joinFixture)) *joinFixture {
	t.Helper()
	ca, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f := &joinFixture{n: newTestNode(t)}
	f.n.formatDisk(t)
	f.n.runner.recordOnly = true
	f.ticket = testTicket(t, f.n.machine.Root)
	f.ticket.DiscoveryTokenCaCertHash = ca.DiscoveryTokenCACertHash()
	f.fake = &fakeJoinService{ca: ca, ticket: f.ticket}
	if prepare != nil {
		prepare(f)
	}
	addr := startJoinService(t, f.n, f.fake)
	f.client = newJoinClient(t, f.n, ca.DiscoveryTokenCACertHash(), controlPlane, addr)
	return f
}

// joinControlPlane joins a fresh node as a control plane whose ticket
// carries files and KMS v2 KEKs (kubeadm only recorded).
func joinControlPlane(t *testing.T, files []*joinservicev1.ControlPlaneFile, keks ...*joinservicev1.EtcdEncryptionKey) (*testNode, error) {
	t.Helper()
	f := newJoinFixture(t, true, func(f *joinFixture) { f.ticket.ControlPlaneFiles, f.ticket.EtcdEncryptionKeys = files, keks })
	return f.n, f.client.Join(t.Context())
}

// TestJoinControlPlaneFiles: a control plane writes the ticket's PKI
// files, keys 0600 and certificates 0644, and the audit policy its API
// server mounts (without it the API server's static pod never starts).
func TestJoinControlPlaneFiles(t *testing.T) {
	kek := bytes.Repeat([]byte{0x4b}, 32)
	n, err := joinControlPlane(t, []*joinservicev1.ControlPlaneFile{
		{Name: "ca.crt", Data: []byte("ca cert")}, {Name: "ca.key", Data: []byte("ca key")},
		{Name: "etcd/ca.key", Data: []byte("etcd key")}, {Name: "sa.pub", Data: []byte("sa pub")},
	}, &joinservicev1.EtcdEncryptionKey{Generation: 1, Key: kek})
	if err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"ca.crt": 0o644, "ca.key": 0o600, "etcd/ca.key": 0o600, "sa.pub": 0o644} {
		if got := fileMode(t, filepath.Join(n.machine.Root, kubeadm.PKIDir, name)); got != mode {
			t.Errorf("%s mode %v, want %v", name, got, mode)
		}
	}
	// The KMS v2 plugin's KEK and the API server's encryption configuration.
	if keks, err := kmsplugin.ReadKEKs(filepath.Join(n.machine.Root, EtcdKEKFile)); err != nil || !bytes.Equal(keks[1], kek) {
		t.Errorf("the KMS v2 KEK file: %v", err)
	}
	for _, p := range []string{EtcdKEKFile, kubeadm.EncryptionConfigPath} {
		if got := fileMode(t, filepath.Join(n.machine.Root, p)); got != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, got)
		}
	}
	want, err := kubeadm.AuditPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(n.machine.Root, kubeadm.AuditPolicyPath)); err != nil || !bytes.Equal(got, want) {
		t.Errorf("audit policy on the joined control plane: %v\n%s", err, got)
	}
}

// TestJoinRefusesMalformedKEKs: a control plane's ticket whose KMS v2
// key-encryption keys are malformed changes nothing on the node: no lock,
// no re-key, no file, no kubeadm.
func TestJoinRefusesMalformedKEKs(t *testing.T) {
	for name, tc := range map[string]struct {
		keks []*joinservicev1.EtcdEncryptionKey
		want string
	}{
		"short key":        {[]*joinservicev1.EtcdEncryptionKey{{Generation: 1, Key: []byte{1, 2, 3}}}, "generation 1: want a generation of at least 1 and a 32-byte key"},
		"generation 0":     {[]*joinservicev1.EtcdEncryptionKey{{Generation: 0, Key: bytes.Repeat([]byte{1}, 32)}}, "generation 0"},
		"generation twice": {[]*joinservicev1.EtcdEncryptionKey{{Generation: 1, Key: bytes.Repeat([]byte{1}, 32)}, {Generation: 1, Key: bytes.Repeat([]byte{2}, 32)}}, "generation 1 given twice"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newJoinFixture(t, true, func(f *joinFixture) { f.ticket.EtcdEncryptionKeys = tc.keks })
			err := f.client.Join(t.Context())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("join = %v, want an error naming %q", err, tc.want)
			}
			n := f.n
			if n.lock.Locked() || n.runner.subcommands() != "" {
				t.Fatal("the refused ticket changed the node")
			}
			if ok, _ := n.disk.TestKey(t.Context(), n.machine.FirstBootKey); !ok {
				t.Fatal("the refused ticket re-keyed the disk")
			}
			if entries, _ := os.ReadDir(n.machine.Root); len(entries) > 0 {
				t.Errorf("files were written: %v", entries)
			}
		})
	}
}

// TestJoinWaitsItsTurnAsTold: a control plane told to retry later (another
// one is joining; google.rpc.RetryInfo) retries after that delay, not
// after a backoff that grew through the wait: here the backoff is an hour.
func TestJoinWaitsItsTurnAsTold(t *testing.T) {
	f := newJoinFixture(t, true, func(f *joinFixture) { f.fake.busy = 3 })
	f.client.calls.backoff = Backoff{Initial: time.Hour, Max: time.Hour}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := f.client.Join(ctx); err != nil {
		t.Fatalf("join after three busy answers: %v\nlogs:\n%s", err, f.n.logs)
	}
	if f.fake.calls != 4 {
		t.Errorf("%d calls, want 4 (three busy)", f.fake.calls)
	}
	if !strings.Contains(f.n.logs.String(), "The join service asks to retry later") {
		t.Errorf("the wait is not logged:\n%s", f.n.logs)
	}
}

// TestJoinRefusesEscapingFileNames: a ticket naming a file outside the PKI
// directory fails the join (after the lock) and writes nothing there.
func TestJoinRefusesEscapingFileNames(t *testing.T) {
	n, err := joinControlPlane(t, []*joinservicev1.ControlPlaneFile{{Name: "../../passwd", Data: []byte("x")}})
	var failed *FailedError
	if !errors.As(err, &failed) || !strings.Contains(err.Error(), "outside the PKI directory") {
		t.Fatalf("escaping file name: %v", err)
	}
	if _, err := os.Stat(filepath.Join(n.machine.Root, "etc/passwd")); !os.IsNotExist(err) {
		t.Fatal("the escaping file was written")
	}
}

// TestJoinFailureAfterLock: kubeadm join fails every bounded attempt (with
// a reset between); the node reports failed and its disk is marked for
// reset.
func TestJoinFailureAfterLock(t *testing.T) {
	f := newJoinFixture(t, false, func(f *joinFixture) {
		f.n.runner.fail = map[string]int{"join": 3}
		f.n.runner.failOutput = "error execution phase kubelet-start: timed out"
	})
	n := f.n
	err := f.client.Join(t.Context())
	var failed *FailedError
	if !errors.As(err, &failed) || !strings.Contains(err.Error(), "attempt 3 of 3") || !strings.Contains(err.Error(), "kubelet-start") {
		t.Fatalf("join error %v, want a FailedError after 3 attempts with kubeadm's output", err)
	}
	if got := n.runner.subcommands(); got != "join,reset,join,reset,join" {
		t.Errorf("kubeadm subcommands %s", got)
	}
	if st, _ := n.disk.State(t.Context()); st != statedisk.ResetRequested {
		t.Errorf("disk state %s", st)
	}
	if st, _ := bootstrapstatus.Read(n.machine.Root); st.Phase != bootstrapstatus.PhaseFailed {
		t.Errorf("status %+v", st)
	}
}

// TestJoinStateUnlockFailure: a join whose state disk cannot hold the
// node's state (open, file system or mounts fail) stops after the re-key,
// before kubeadm, with the disk marked for reset and the node failed.
func TestJoinStateUnlockFailure(t *testing.T) {
	vol := &recordingVolume{fail: errors.New("mounting the state disk at /run/gatehouse/state: device busy")}
	f := newJoinFixture(t, false, func(f *joinFixture) { f.n.machine.State = vol })
	n, ticket := f.n, f.ticket
	err := f.client.Join(t.Context())
	var failed *FailedError
	if !errors.As(err, &failed) || !strings.Contains(err.Error(), "putting the node's state on the state disk") {
		t.Fatalf("join error %v, want a FailedError naming the state disk", err)
	}
	vol.unlockedWith(t, ticket.GetStateDiskKey())
	if got := n.runner.subcommands(); got != "" {
		t.Errorf("kubeadm ran (%s) though the state disk could not hold the state", got)
	}
	if st, _ := n.disk.State(t.Context()); st != statedisk.ResetRequested {
		t.Errorf("disk state %s, want reset requested", st)
	}
}

// TestJoinRefused: a refusal that retrying cannot change ends the join
// before the lock, with nothing changed.
func TestJoinRefused(t *testing.T) {
	ca, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t)
	n.formatDisk(t)
	ticket := testTicket(t, n.machine.Root)
	fake := &fakeJoinService{ca: ca, ticket: ticket, refuse: codes.PermissionDenied}
	addr := startJoinService(t, n, fake)
	err = newJoinClient(t, n, ca.DiscoveryTokenCACertHash(), false, addr).Join(t.Context())
	if status.Code(errors.Unwrap(err)) != codes.PermissionDenied && !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("refused join: %v", err)
	}
	if n.lock.Locked() || n.runner.subcommands() != "" {
		t.Fatal("a refused join changed the node")
	}
	if ok, _ := n.disk.TestKey(t.Context(), n.machine.FirstBootKey); !ok {
		t.Fatal("a refused join re-keyed the disk")
	}

	// A service with another cluster identity is not trusted at all.
	other, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fake.refuse = codes.OK
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	err = newJoinClient(t, n, other.DiscoveryTokenCACertHash(), false, addr).Join(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || n.lock.Locked() {
		t.Fatalf("join against an untrusted service: %v (locked %v)", err, n.lock.Locked())
	}
	if !strings.Contains(n.logs.String(), "cluster") {
		t.Errorf("the logs do not say why the service was not trusted:\n%s", n.logs)
	}
}

// TestJoinLogsRefusedEvidence: when the join service refuses the node's
// evidence, the node says so clearly (the service does not tell why) and
// keeps retrying, unlocked.
func TestJoinLogsRefusedEvidence(t *testing.T) {
	ca, _, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t)
	n.formatDisk(t)
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := tpm.ReferenceValues(bootArtefacts, testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	refusing, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: testPCRs, ReferenceValues: ref,
		Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{other.Public()}}}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := atls.NewCredentials(atls.Config{Verifiers: []attestation.Verifier{refusing}, Certificate: clusterpki.NewIdentity(ca, time.Now).Certificate})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	joinservicev1.RegisterJoinServiceServer(srv, &fakeJoinService{ca: ca, ticket: testTicket(t, n.machine.Root)})
	addr := serve(t, srv)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := newJoinClient(t, n, ca.DiscoveryTokenCACertHash(), false, addr).Join(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("join with refused evidence: %v, want to keep retrying until the deadline", err)
	}
	if n.lock.Locked() || !strings.Contains(n.logs.String(), "refused this node's attestation evidence") {
		t.Fatalf("locked %v; logs:\n%s", n.lock.Locked(), n.logs)
	}
}

// TestJoinSyncsStateBeforeDone: a join counts as done only once the state
// kubeadm wrote is on the state disk; a state disk that cannot be synced
// fails the join with the disk marked for reset (a power cut would lose
// what kubeadm wrote, leaving a node that cannot rejoin).
func TestJoinSyncsStateBeforeDone(t *testing.T) {
	for _, tt := range []struct {
		name      string
		fail      error
		wantPhase bootstrapstatus.Phase
	}{
		{"synced", nil, bootstrapstatus.PhaseDone},
		{"sync fails", errors.New("syncfs: input/output error"), bootstrapstatus.PhaseFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vol := &recordingVolume{syncFail: tt.fail}
			f := newJoinFixture(t, false, func(f *joinFixture) { f.n.machine.State = vol })
			err := f.client.Join(t.Context())
			if tt.fail == nil && err != nil {
				t.Fatal(err)
			}
			if tt.fail != nil && (err == nil || !strings.Contains(err.Error(), "writing the node's state through to its state disk")) {
				t.Fatalf("join error %v, want one naming the state disk's sync", err)
			}
			if vol.syncs != 1 {
				t.Errorf("the state disk was synced %d times, want once", vol.syncs)
			}
			if st, _ := bootstrapstatus.Read(f.n.machine.Root); st.Phase != tt.wantPhase {
				t.Errorf("status %+v, want phase %s", st, tt.wantPhase)
			}
			if st, _ := f.n.disk.State(t.Context()); (st == statedisk.ResetRequested) != (tt.fail != nil) {
				t.Errorf("disk state %s after the join (sync error %v)", st, tt.fail)
			}
		})
	}
}
