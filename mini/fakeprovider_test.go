package mini

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

// events is what the fake providers of one test did, in order, as
// "<provider> <call> <node>" ("netns create cp-0", "qemu start
// worker-2"); the test's Init adds "init".
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, fmt.Sprintf(format, args...))
}

func (e *events) all() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.list)
}

// index is where event ev happened, -1 if it did not.
func (e *events) index(ev string) int { return slices.Index(e.all(), ev) }

// fakeProvider makes no machine: it records its calls in events, what
// it "made" (a node's LoopDevice names it, as the netns provider's
// records its loop device) and which machines "run".
type fakeProvider struct {
	name   string
	early  bool   // StartsBeforeJoinData
	failOn string // a call ("create worker-2") that fails
	ev     *events

	mu      sync.Mutex
	made    map[string]bool
	running map[string]bool
}

func newFake(name string, early bool, ev *events) *fakeProvider {
	return &fakeProvider{name: name, early: early, ev: ev, made: map[string]bool{}, running: map[string]bool{}}
}

func (f *fakeProvider) Name() string               { return f.name }
func (f *fakeProvider) StartsBeforeJoinData() bool { return f.early }

func (f *fakeProvider) call(call, node string) error {
	f.ev.add("%s %s %s", f.name, call, node)
	if f.failOn == call+" "+node {
		return fmt.Errorf("the fake fails to %s %s", call, node)
	}
	return nil
}

func (f *fakeProvider) Create(_ context.Context, s *NodeSpec, nr *NodeRecord) error {
	f.mu.Lock()
	f.made[s.Name] = true
	f.mu.Unlock()
	// Recorded before it fails: Delete must find what a failed Create made.
	nr.LoopDevice = "fake:" + s.Name
	return f.call("create", s.Name)
}

func (f *fakeProvider) Start(_ context.Context, s *NodeSpec, nr *NodeRecord) error {
	if !f.early && !s.Init && s.SeedDisk == "" && (len(s.JoinEndpoints) == 0 || s.CACertHash == "") {
		return fmt.Errorf("%s started without its join data", s.Name)
	}
	if err := f.call("start", s.Name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running[s.Name] = true
	nr.AgentPID = 1 // "runs"
	return nil
}

func (f *fakeProvider) Stop(_ context.Context, nr *NodeRecord) error {
	f.mu.Lock()
	f.running[nr.Name] = false
	f.mu.Unlock()
	nr.AgentPID = 0
	return f.call("stop", nr.Name)
}

func (f *fakeProvider) Reset(ctx context.Context, s *NodeSpec, nr *NodeRecord) error {
	if err := f.call("reset", nr.Name); err != nil {
		return err
	}
	return f.Start(ctx, s, nr)
}

func (f *fakeProvider) Delete(_ context.Context, nr *NodeRecord) error {
	if nr.LoopDevice != "fake:"+nr.Name {
		return fmt.Errorf("the record of %s names no machine of the fake: %+v", nr.Name, nr)
	}
	f.mu.Lock()
	delete(f.made, nr.Name)
	f.running[nr.Name] = false
	f.mu.Unlock()
	return f.call("delete", nr.Name)
}

func (f *fakeProvider) Exec(context.Context, *NodeRecord, ...string) ([]byte, error) {
	return nil, ErrNoExec
}

func (f *fakeProvider) Logs(nr *NodeRecord) []string { return []string{nr.Dir + "/fake.log"} }

func (f *fakeProvider) Running(nr *NodeRecord) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running[nr.Name]
}

// leftovers names the nodes the fake made that are not deleted.
func (f *fakeProvider) leftovers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.made {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// fakes are a netns-like provider (starts before the join data) and a
// VM-like one (starts after), under the real providers' names.
type fakes struct {
	ev          *events
	netns, qemu *fakeProvider
}

func newFakes() *fakes {
	ev := &events{}
	return &fakes{ev: ev, netns: newFake(ProviderNetNS, true, ev), qemu: newFake(ProviderQEMU, false, ev)}
}

func (fs *fakes) providers() map[string]Provider {
	return map[string]Provider{ProviderNetNS: fs.netns, ProviderQEMU: fs.qemu}
}

// lookup finds a node's fake by the provider its record names.
func (fs *fakes) lookup(_ *Record, nr *NodeRecord) (Provider, error) {
	switch nr.Provider {
	case ProviderNetNS, "":
		return fs.netns, nil
	case ProviderQEMU:
		return fs.qemu, nil
	}
	return nil, fmt.Errorf("no fake provider %q", nr.Provider)
}

// dialRunning is a dial whose connections succeed once the node at the
// address runs on its fake: its bootstrapper "listens".
func (fs *fakes) dialRunning(plan *clusterPlan) func(context.Context, string, string) (net.Conn, error) {
	return func(_ context.Context, _, address string) (net.Conn, error) {
		for _, n := range plan.all() {
			if address == net.JoinHostPort(n.spec.IP, fmt.Sprint(initPort)) && n.provider.Running(&NodeRecord{Name: n.spec.Name}) {
				c, s := net.Pipe()
				_ = s.Close()
				return c, nil
			}
		}
		return nil, fmt.Errorf("dial tcp %s: connection refused", address)
	}
}

// testUp is an up of opts on fake providers, its record created in a
// temporary directory, whose Init writes an admin kubeconfig trusting a
// cluster CA and records "init".
func testUp(t *testing.T, fs *fakes, opts Options) *up {
	t.Helper()
	opts.Dir = filepath.Join(t.TempDir(), "mini")
	opts.Network = 3
	if opts.ControlPlanes == 0 {
		opts.ControlPlanes = 1
	}
	opts.Init = func(_ context.Context, dir, config, node, secretFile string, _ []*componentsv1.Component, _ io.Writer) error {
		fs.ev.add("init")
		if node != opts.Network.NodeIP(0)+":9000" {
			return fmt.Errorf("init of %s, want the first control plane", node)
		}
		_, err := writeTestKubeconfig(filepath.Join(dir, "gatehouse-admin.conf"))
		return err
	}
	u := &up{opts: opts, p: &progress{out: io.Discard}, providers: fs.providers()}
	if err := u.createRecord(); err != nil {
		t.Fatal(err)
	}
	return u
}

// nodePhases runs Up's node phases on u, in Up's order, as far as they
// go without an API server: startNodes, initControlPlane, startJoins.
func nodePhases(ctx context.Context, u *up, fs *fakes) (*clusterPlan, error) {
	base := nodeBase{images: &nodeImages{manifest: bootManifest("v1.36.4", "00")}, hashFile: "hash"}
	plan := u.planNodes(base)
	u.dial = fs.dialRunning(plan)
	joiners, err := u.startNodes(ctx, plan)
	if err != nil {
		return plan, err
	}
	kubeconfig, err := u.initControlPlane(ctx, plan, joiners, clusterFiles{config: "config"}, initSecret{file: "secret"})
	if err != nil {
		return plan, err
	}
	_, err = u.startJoins(ctx, plan, kubeconfig)
	return plan, err
}

// names are the nodes' names.
func names(nodes []*plannedNode) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.spec.Name+"/"+n.provider.Name())
	}
	return out
}

// mustContain fails unless s contains every one of want.
func mustContain(t *testing.T, s string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("%q lacks %q", s, w)
		}
	}
}

// readRecord reads the record of the cluster in dir.
func readRecord(t *testing.T, dir string) *Record {
	t.Helper()
	rec, err := ReadRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// pathExists reports whether path exists.
func pathExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeTestKubeconfig writes an admin kubeconfig at path trusting a new
// self-signed cluster CA, and returns the CA's PEM.
func writeTestKubeconfig(path string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["mini"] = &clientcmdapi.Cluster{Server: "https://10.88.3.10:6443", CertificateAuthorityData: ca}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: "t"}
	cfg.Contexts["admin@mini"] = &clientcmdapi.Context{Cluster: "mini", AuthInfo: "admin"}
	cfg.CurrentContext = "admin@mini"
	return ca, clientcmd.WriteToFile(*cfg, path)
}
