package bootstrapper

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
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

	if err := writeStatus(n.machine.Root, bootstrapstatus.PhaseFailed, errors.New("kubeadm join failed"), time.Now()); err != nil {
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
	js := &fakeJoinService{ca: ca, ticket: ticket}
	addr := startJoinService(t, n, js)
	f := newRunFixture(t, n, ca, addr)
	vol := &recordingVolume{}
	n.machine.State = vol
	// The kubelet's credentials are good for an hour: the rejoin leaves them.
	writeKubeletClient(t, n.machine, ca, time.Now(), time.Hour)
	if err := awaitRun(t, f.run(t.Context())); err != nil {
		t.Fatal(err)
	}
	vol.unlockedWith(t, ticket.GetStateDiskKey())
	if vol.syncs != 1 {
		t.Errorf("the state disk was synced %d times before the rejoin counted as done, want once", vol.syncs)
	}
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
	if _, err := os.Stat(filepath.Join(n.machine.Root, bootstrapKubeconfig)); !os.IsNotExist(err) {
		t.Errorf("a bootstrap kubeconfig was written, yet the kubelet's credentials were good (%v)", err)
	}
}

// writeKubeletClient gives machine's kubelet a kubelet.conf for
// https://10.0.0.1:6443 and a client certificate of ca valid lifetime from
// notBefore.
func writeKubeletClient(t *testing.T, machine *Machine, ca *clusterpki.CA, notBefore time.Time, lifetime time.Duration) {
	t.Helper()
	certPEM, keyPEM, err := ca.SignKubeletClient(machine.Node.Name, notBefore, lifetime)
	if err != nil {
		t.Fatal(err)
	}
	if err := machine.writeKubeletPair("kubelet-client", certPEM, keyPEM, notBefore); err != nil {
		t.Fatal(err)
	}
	current := machine.path(kubeletClientCurrent)
	kubeconfig := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"c": {Server: "https://10.0.0.1:6443", CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate().Raw})}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"kubelet": {ClientCertificate: current, ClientKey: current}},
		Contexts:       map[string]*clientcmdapi.Context{"kubelet@c": {Cluster: "c", AuthInfo: "kubelet"}},
		CurrentContext: "kubelet@c",
	}
	data, err := clientcmd.Write(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := machine.writeFile(kubeadm.KubeletKubeconfigPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRunRejoinRenewsExpiredKubeletCredentials: a rejoining node asks for a
// bootstrap token for its own name (before the node lock, while the join
// service still answers it); a worker that was off for longer than the
// kubelet certificate lifetime gives it to its kubelet in a bootstrap
// kubeconfig for its API server; a control plane signs a new client
// certificate with the cluster CA it holds, valid as long as the old one.
func TestRunRejoinRenewsExpiredKubeletCredentials(t *testing.T) {
	long := time.Now().Add(-48 * time.Hour)
	t.Run("worker", func(t *testing.T) {
		ca, n, ticket := rebootedNode(t)
		js := &fakeJoinService{ca: ca, ticket: ticket}
		f := newRunFixture(t, n, ca, startJoinService(t, n, js))
		n.machine.State = &recordingVolume{}
		writeKubeletClient(t, n.machine, ca, long, 24*time.Hour)
		if err := awaitRun(t, f.run(t.Context())); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(js.renewedFor, []string{n.machine.Node.Name}) {
			t.Fatalf("kubelet credentials renewed for %v, want [%s]", js.renewedFor, n.machine.Node.Name)
		}
		cfg, err := clientcmd.LoadFromFile(filepath.Join(n.machine.Root, bootstrapKubeconfig))
		if err != nil {
			t.Fatal(err)
		}
		ctx := cfg.Contexts[cfg.CurrentContext]
		if ctx == nil || cfg.AuthInfos[ctx.AuthInfo].Token != rejoinToken || cfg.Clusters[ctx.Cluster].Server != "https://10.0.0.1:6443" {
			t.Errorf("bootstrap kubeconfig %+v", cfg)
		}
		if got := fileMode(t, filepath.Join(n.machine.Root, bootstrapKubeconfig)); got != 0o600 {
			t.Errorf("bootstrap kubeconfig (it holds a token) has mode %v", got)
		}
		if f.kubelet.restarts.Load() != 1 {
			t.Error("the kubelet was not restarted")
		}
	})
	t.Run("control plane", func(t *testing.T) {
		ca, n, ticket := rebootedNode(t)
		js := &fakeJoinService{ca: ca, ticket: ticket}
		f := newRunFixture(t, n, ca, startJoinService(t, n, js))
		n.machine.State = &recordingVolume{}
		diskCA, caCert, caKey, err := clusterpki.GenerateCA(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"ca.crt": caCert, "ca.key": caKey} {
			if err := n.machine.writeFile(kubeadm.PKIDir+"/"+name, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		writeKubeletClient(t, n.machine, diskCA, long, 3*time.Hour)
		if err := awaitRun(t, f.run(t.Context())); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(n.machine.Root, bootstrapKubeconfig)); !os.IsNotExist(err) {
			t.Errorf("a control plane wrote a bootstrap kubeconfig (%v); it signs its own", err)
		}
		pair, err := tls.LoadX509KeyPair(filepath.Join(n.machine.Root, kubeletClientCurrent), filepath.Join(n.machine.Root, kubeletClientCurrent))
		if err != nil {
			t.Fatal(err)
		}
		if c := pair.Leaf; c.NotAfter.Before(time.Now()) || c.NotAfter.Sub(c.NotBefore) != 3*time.Hour+clusterpki.ClockSkew ||
			c.Subject.CommonName != "system:node:"+n.machine.Node.Name {
			t.Errorf("renewed kubelet client certificate %s valid %s to %s, want its node's for 3 h from now", c.Subject, c.NotBefore, c.NotAfter)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(caCert)
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("the renewed certificate does not chain to the cluster CA: %v", err)
		}
	})
}
