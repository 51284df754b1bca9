package bootstrapper

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"google.golang.org/grpc"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/installer"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// testPCRs are quoted by the test nodes: firmware, boot loader, node lock.
var testPCRs = []int{0, 4, keys.NodeLockPCR}

var bootArtefacts = []tpm.Artefact{tpm.BytesArtefact(4, "gatehouse-bootstrapper", []byte("bootstrapper v1"))}

// testNode is a node with its own simulated TPM (the one per process),
// a LUKS state disk on a loop device, and a temporary root.
type testNode struct {
	sim      *simulator.Simulator
	attester *tpmattester.QuoteAttester
	lock     *nodelock.Lock
	disk     *statedisk.Disk
	machine  *Machine
	logs     *testkit.LogBuffer
	runner   *dryRunRunner
}

func newTestNode(t *testing.T) *testNode {
	t.Helper()
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	if _, err := tpmattester.MeasureBoot(sim, bootArtefacts); err != nil {
		t.Fatal(err)
	}
	a, err := tpmattester.New(sim, tpmattester.Options{PCRs: testPCRs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	lock, err := nodelock.New(sim)
	if err != nil {
		t.Fatal(err)
	}
	disk, err := statedisk.New(testenv.LoopDevice(t, 32<<20))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.LogBuffer{}
	runner := &dryRunRunner{t: t}
	n := &testNode{sim: sim, attester: a, lock: lock, disk: disk, logs: logs, runner: runner}
	n.machine = &Machine{
		Root:      t.TempDir(),
		Disk:      disk,
		Installer: installer.New(installer.Options{Attempts: 2, Backoff: time.Millisecond}),
		Kubeadm:   runner,
		Node:      kubeadm.Node{Name: "node-1", AdvertiseAddress: testenv.HostAddress(t), IgnorePreflightErrors: []string{"all"}},
		Kubelet:   kubeadm.KubeletOptions{CgroupDriver: "cgroupfs", ServingCert: true},
		Log:       slog.New(slog.NewJSONHandler(logs, nil)),
	}
	return n
}

// formatDisk formats the state disk as a first boot does.
func (n *testNode) formatDisk(t *testing.T) {
	t.Helper()
	key, err := n.disk.FormatRandom(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n.machine.FirstBootKey = key
}

// verifier appraises the test nodes' evidence: their boot, and PCR 15
// zero (not locked) unless lockedOK.
// identity is the node's attestation identity, which its disk key is bound to.
func (n *testNode) identity(t testing.TB) string {
	t.Helper()
	id, err := n.attester.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func verifier(t *testing.T, a *tpmattester.QuoteAttester, lockedOK ...bool) *tpm.QuoteVerifier {
	t.Helper()
	ref, err := tpm.ReferenceValues(bootArtefacts, testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	if len(lockedOK) > 0 && lockedOK[0] {
		m := ref[keys.NodeLockPCR]
		m.WarnOnly = true
		ref[keys.NodeLockPCR] = m
	}
	v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{
		PCRs: testPCRs, ReferenceValues: ref,
		Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{a.AttestationKey()}},
	}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// serve runs srv on a loopback listener until the test ends and returns
// its address.
func serve(t *testing.T, srv *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// dial returns a connection with attested TLS config c.
func dial(t *testing.T, addr string, c atls.Config) *grpc.ClientConn {
	t.Helper()
	creds, err := atls.NewCredentials(c)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// component returns a component installing content under root via file://.
func component(t *testing.T, root, name, content string) *componentsv1.Component {
	t.Helper()
	src := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(src, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return &componentsv1.Component{
		Url:         "file://" + src,
		Hash:        fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(content))),
		InstallPath: filepath.Join(root, "usr/local/bin", name),
	}
}

// dryRunRunner runs the real kubeadm for init and join with --dry-run in a
// private mount namespace; other subcommands (token delete, reset) are only
// recorded. fail makes the first fail[subcommand] calls of a subcommand
// fail with failOutput.
type dryRunRunner struct {
	t          *testing.T
	mu         sync.Mutex
	calls      [][]string
	fail       map[string]int
	failOutput string
	// recordOnly skips running kubeadm for init and join too.
	recordOnly bool
	// onRun, if set, runs first on every call.
	onRun func(args []string)
}

func (r *dryRunRunner) Run(ctx context.Context, args ...string) ([]byte, error) {
	if r.onRun != nil {
		r.onRun(args)
	}
	r.mu.Lock()
	r.calls = append(r.calls, args)
	if r.fail[args[0]] > 0 {
		r.fail[args[0]]--
		r.mu.Unlock()
		return []byte(r.failOutput), fmt.Errorf("kubeadm %s: exit status 1", args[0])
	}
	r.mu.Unlock()
	if r.recordOnly || (args[0] != "init" && args[0] != "join") {
		return nil, nil
	}
	dir, err := testenv.BinDir()
	if err != nil {
		return nil, err
	}
	scratch, err := os.MkdirTemp("", "kubeadm-dry-run-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	return testenv.RunIsolated(ctx, scratch, filepath.Join(dir, "kubeadm"), append(slices.Clone(args), "--dry-run")...)
}

// subcommands returns the subcommands run so far.
func (r *dryRunRunner) subcommands() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, c := range r.calls {
		s = append(s, c[0])
	}
	return strings.Join(s, ",")
}

// servingCert returns the certificate the kubelet's serving certificate
// store under root holds, checking the store's layout: a link to a file
// of mode 0600 with the certificate and its key.
func servingCert(t *testing.T, root string) *x509.Certificate {
	t.Helper()
	current := filepath.Join(root, kubeadm.KubeletPKIDir, kubeadm.KubeletServingPrefix+"-current.pem")
	if fi, err := os.Lstat(current); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("%s is not a link (%v): the kubelet could not renew it", current, err)
	}
	if got := fileMode(t, current); got != 0o600 {
		t.Errorf("kubelet serving certificate and key have mode %v", got)
	}
	pair, err := tls.LoadX509KeyPair(current, current)
	if err != nil {
		t.Fatalf("the kubelet serving certificate store: %v", err)
	}
	return pair.Leaf
}

func parsePEMCert(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	return x509.ParseCertificate(block.Bytes)
}

// recordingVolume stands in for statedisk.Volume (which needs
// device-mapper): it records the keys the state disk was unlocked with,
// and fails with fail when set.
type recordingVolume struct {
	mu   sync.Mutex
	keys [][]byte
	fail error
	// syncs counts Sync calls; syncFail is what they return.
	syncs    int
	syncFail error
}

func (v *recordingVolume) Unlock(_ context.Context, key []byte) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.keys = append(v.keys, bytes.Clone(key))
	return v.fail
}

func (v *recordingVolume) Sync() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.syncs++
	return v.syncFail
}

// unlockedWith fails t unless the state was unlocked exactly once, with key.
func (v *recordingVolume) unlockedWith(t *testing.T, key []byte) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.keys) != 1 || !bytes.Equal(v.keys[0], key) {
		t.Fatalf("the state volume was unlocked %d times (want once, with the node's disk key)", len(v.keys))
	}
}

// nameBindings stands in for BindNodeName where kubeadm is only recorded
// (no cluster to bind in): it records node → identity.
type nameBindings struct {
	mu    sync.Mutex
	bound map[string]string
	fail  error // when set, every bind fails with it
}

func (b *nameBindings) bind(_ context.Context, _, node, identity string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail != nil {
		return b.fail
	}
	if b.bound == nil {
		b.bound = map[string]string{}
	}
	b.bound[node] = identity
	return nil
}

func (b *nameBindings) of(node string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bound[node]
}
