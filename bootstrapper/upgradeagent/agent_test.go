package upgradeagent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	upgradeagentv1 "github.com/gatehouse-dev/gatehouse/api/upgradeagent/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

const hash = "sha256:0000000000000000000000000000000000000000000000000000000000000000"

// node is a fake node: what was installed, what kubeadm ran, how often
// the kubelet restarted.
type node struct {
	mu        sync.Mutex
	version   string // what kubeadm version says
	installed []string
	kubeadm   [][]string
	restarts  int
	// failKubeadm fails `kubeadm upgrade`; block holds it until closed.
	failKubeadm bool
	block       chan struct{}
	// kubeadmCtxErr is the context's error when kubeadm finished.
	kubeadmCtxErr error
}

func (n *node) Install(_ context.Context, list []*componentsv1.Component) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range list {
		n.installed = append(n.installed, filepath.Base(c.GetInstallPath()))
	}
	return nil
}

func (n *node) Run(ctx context.Context, args ...string) ([]byte, error) {
	if args[0] == "version" {
		n.mu.Lock()
		defer n.mu.Unlock()
		return []byte(n.version + "\n"), nil
	}
	if n.block != nil {
		<-n.block
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.kubeadm = append(n.kubeadm, args)
	n.kubeadmCtxErr = ctx.Err()
	if n.failKubeadm {
		return []byte("[preflight] line 1\n[ERROR CreateJob]: the health check job did not complete\n"), errors.New("exit status 1")
	}
	return []byte("[upgrade] SUCCESS\n"), nil
}

func (n *node) Restart(context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.restarts++
	return nil
}

// changed says what the node did besides reading kubeadm's version.
func (n *node) changed() (installed []string, kubeadm [][]string, restarts int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.installed), slices.Clone(n.kubeadm), n.restarts
}

func components(dir string) []*componentsv1.Component {
	var out []*componentsv1.Component
	for _, name := range []string{"kubelet", "kubeadm", "kubectl"} {
		out = append(out, &componentsv1.Component{Url: "https://dl.k8s.io/v1.36.4/" + name, Hash: hash, InstallPath: filepath.Join(dir, name)})
	}
	return out
}

func newAgent(t *testing.T, n *node, healthy func(context.Context) error) *Server {
	t.Helper()
	if healthy == nil {
		healthy = func(context.Context) error { return nil }
	}
	s, err := New(Options{Installer: n, Kubeadm: n, Kubelet: n, InstallDir: "/usr/local/bin", KubeletHealthy: healthy, IgnorePreflightErrors: []string{"Swap", "NumCPU"},
		PatchesDir: filepath.Join(t.TempDir(), "no-patches")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serve serves s on an in-memory listener without TLS (the door has its
// own test) and returns a client.
func serve(t *testing.T, s *Server) upgradeagentv1.UpgradeAgentServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	upgradeagentv1.RegisterUpgradeAgentServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///agent", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return upgradeagentv1.NewUpgradeAgentServiceClient(conn)
}

// upgrade calls Upgrade and returns the progress messages and the status.
func upgrade(ctx context.Context, client upgradeagentv1.UpgradeAgentServiceClient, req *upgradeagentv1.UpgradeRequest) ([]string, error) {
	stream, err := client.Upgrade(ctx, req)
	if err != nil {
		return nil, err
	}
	var msgs []string
	for {
		m, err := stream.Recv()
		if err != nil {
			if status.Code(err) == codes.OK || strings.Contains(err.Error(), "EOF") {
				return msgs, nil
			}
			return msgs, err
		}
		msgs = append(msgs, m.GetMessage())
	}
}

func request(step upgradeagentv1.Step) *upgradeagentv1.UpgradeRequest {
	return &upgradeagentv1.UpgradeRequest{KubernetesVersion: "v1.36.4", Components: components("/usr/local/bin"), Step: step, KubeletTimeoutSeconds: 1}
}

// TestSteps: each step does its part in kubeadm's order and nothing else.
func TestSteps(t *testing.T) {
	tests := []struct {
		name          string
		step          upgradeagentv1.Step
		kubeadm       string // what the node's kubeadm says it is
		wantInstalled []string
		wantKubeadm   []string
		wantRestarts  int
	}{
		{"apply, the first control plane", upgradeagentv1.Step_STEP_APPLY, "v1.35.8", []string{"kubeadm"},
			[]string{"upgrade", "apply", "v1.36.4", "--yes", "--ignore-preflight-errors=Swap,NumCPU"}, 0},
		{"node, another control plane or a worker", upgradeagentv1.Step_STEP_NODE, "v1.35.8", []string{"kubeadm"},
			[]string{"upgrade", "node", "--ignore-preflight-errors=Swap,NumCPU"}, 0},
		{"node again, resumed", upgradeagentv1.Step_STEP_NODE, "v1.36.4", []string{"kubeadm"},
			[]string{"upgrade", "node", "--ignore-preflight-errors=Swap,NumCPU"}, 0},
		{"kubelet, after kubeadm", upgradeagentv1.Step_STEP_KUBELET, "v1.36.4", []string{"kubelet", "kubectl"}, nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &node{version: tt.kubeadm}
			msgs, err := upgrade(t.Context(), serve(t, newAgent(t, n, nil)), request(tt.step))
			if err != nil {
				t.Fatalf("Upgrade: %v", err)
			}
			installed, kubeadm, restarts := n.changed()
			if !slices.Equal(installed, tt.wantInstalled) || restarts != tt.wantRestarts {
				t.Errorf("installed %v, restarts %d; want %v, %d", installed, restarts, tt.wantInstalled, tt.wantRestarts)
			}
			switch {
			case tt.wantKubeadm == nil && len(kubeadm) != 0:
				t.Errorf("kubeadm ran %v", kubeadm)
			case tt.wantKubeadm != nil && (len(kubeadm) != 1 || !slices.Equal(kubeadm[0], tt.wantKubeadm)):
				t.Errorf("kubeadm ran %v, want %v", kubeadm, tt.wantKubeadm)
			}
			if len(msgs) == 0 {
				t.Error("no progress streamed")
			}
		})
	}
}

// TestPatches: the node's own kubeadm patches go to kubeadm upgrade when
// it has them (a joined node: its kubelet's cgroup root, for one, over
// the cluster's, which are the first control plane's).
func TestPatches(t *testing.T) {
	patches := t.TempDir()
	n := &node{version: "v1.35.8"}
	s, err := New(Options{Installer: n, Kubeadm: n, Kubelet: n, InstallDir: "/usr/local/bin", PatchesDir: patches})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := upgrade(t.Context(), serve(t, s), request(upgradeagentv1.Step_STEP_NODE)); err != nil {
		t.Fatal(err)
	}
	if _, kubeadm, _ := n.changed(); len(kubeadm) != 1 || !slices.Equal(kubeadm[0], []string{"upgrade", "node", "--patches=" + patches}) {
		t.Errorf("kubeadm ran %v, want upgrade node --patches=%s", kubeadm, patches)
	}
}

// TestRefusals: a request the node must not follow is refused before it
// changes anything: nothing installed, kubeadm not run, the kubelet not
// restarted.
func TestRefusals(t *testing.T) {
	elsewhere := components("/usr/local/bin")
	elsewhere[0].InstallPath = "/etc/systemd/system/kubelet"
	unknown := append(components("/usr/local/bin"), &componentsv1.Component{Url: "https://example.com/x", Hash: hash, InstallPath: "/usr/local/bin/sshd"})
	twice := append(components("/usr/local/bin"), components("/usr/local/bin")[0])
	extract := components("/usr/local/bin")
	extract[2].Extract = true
	tests := []struct {
		name     string
		kubeadm  string
		mutate   func(*upgradeagentv1.UpgradeRequest)
		code     codes.Code
		contains string
	}{
		{"a minor version, not a release", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.KubernetesVersion = "1.36" }, codes.InvalidArgument, "name the exact release (v1.36.4)"},
		{"an unsupported release", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.KubernetesVersion = "v1.36.3" }, codes.InvalidArgument, "not supported"},
		{"no step", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.Step = upgradeagentv1.Step_STEP_UNSPECIFIED }, codes.InvalidArgument, "APPLY"},
		{"a component outside the install directory", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.Components = elsewhere }, codes.InvalidArgument, "/etc/systemd/system/kubelet"},
		{"another file", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.Components = unknown }, codes.InvalidArgument, "sshd"},
		{"a component twice", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.Components = twice }, codes.InvalidArgument, "named twice"},
		{"an archive", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.Components = extract }, codes.InvalidArgument, "kubectl"},
		{"a component missing", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.Components = r.Components[:2] }, codes.InvalidArgument, "names 2 of the components"},
		{"a skipped minor version", "v1.34.11", func(*upgradeagentv1.UpgradeRequest) {}, codes.FailedPrecondition, "skips a minor version"},
		{"a downgrade", "v1.36.5", func(*upgradeagentv1.UpgradeRequest) {}, codes.FailedPrecondition, "cannot be downgraded"},
		{"the kubelet before kubeadm moved", "v1.35.8", func(r *upgradeagentv1.UpgradeRequest) { r.Step = upgradeagentv1.Step_STEP_KUBELET }, codes.FailedPrecondition, "only after kubeadm upgrade ran"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &node{version: tt.kubeadm}
			req := request(upgradeagentv1.Step_STEP_NODE)
			tt.mutate(req)
			_, err := upgrade(t.Context(), serve(t, newAgent(t, n, nil)), req)
			if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.contains) {
				t.Fatalf("Upgrade = %v, want %s containing %q", err, tt.code, tt.contains)
			}
			if installed, kubeadm, restarts := n.changed(); len(installed)+len(kubeadm)+restarts != 0 {
				t.Errorf("a refused request changed the node: installed %v, kubeadm %v, restarts %d", installed, kubeadm, restarts)
			}
		})
	}
}

// TestFailures: a failed kubeadm stops before the kubelet, naming
// kubeadm's own error; a kubelet that does not become healthy is
// reported with where its log is.
func TestFailures(t *testing.T) {
	n := &node{version: "v1.35.8", failKubeadm: true}
	_, err := upgrade(t.Context(), serve(t, newAgent(t, n, nil)), request(upgradeagentv1.Step_STEP_APPLY))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "[ERROR CreateJob]") {
		t.Fatalf("a failed kubeadm upgrade apply: %v", err)
	}
	if installed, _, restarts := n.changed(); !slices.Equal(installed, []string{"kubeadm"}) || restarts != 0 {
		t.Errorf("after a failed kubeadm: installed %v, restarts %d", installed, restarts)
	}

	n = &node{version: "v1.36.4"}
	unhealthy := func(context.Context) error { return errors.New("connection refused") }
	_, err = upgrade(t.Context(), serve(t, newAgent(t, n, unhealthy)), request(upgradeagentv1.Step_STEP_KUBELET))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "did not become healthy within 1s") || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "journalctl -u kubelet") {
		t.Fatalf("an unhealthy kubelet: %v", err)
	}
}

// TestOneAtATimeAndCallerGone: a second request while a step runs is
// Aborted and changes nothing; the running step finishes even though
// its caller went away.
func TestOneAtATimeAndCallerGone(t *testing.T) {
	n := &node{version: "v1.35.8", block: make(chan struct{})}
	client := serve(t, newAgent(t, n, nil))
	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan error, 1)
	go func() {
		_, err := upgrade(ctx, client, request(upgradeagentv1.Step_STEP_APPLY))
		first <- err
	}()
	// Wait until the first request holds the node (it installed kubeadm).
	deadline := time.Now().Add(10 * time.Second)
	for installed, _, _ := n.changed(); len(installed) == 0; installed, _, _ = n.changed() {
		if time.Now().After(deadline) {
			t.Fatal("the first request never started")
		}
		time.Sleep(10 * time.Millisecond) //nolint:forbidigo // polling a fake with a deadline
	}
	_, err := upgrade(t.Context(), client, request(upgradeagentv1.Step_STEP_NODE))
	if status.Code(err) != codes.Aborted {
		t.Fatalf("a second request while one runs: %v, want Aborted", err)
	}
	cancel() // the caller goes
	if err := <-first; status.Code(err) != codes.Canceled {
		t.Errorf("the caller that went away got %v, want Canceled", err)
	}
	close(n.block)
	deadline = time.Now().Add(10 * time.Second)
	for _, kubeadm, _ := n.changed(); len(kubeadm) == 0; _, kubeadm, _ = n.changed() {
		if time.Now().After(deadline) {
			t.Fatal("kubeadm did not finish after its caller went")
		}
		time.Sleep(10 * time.Millisecond) //nolint:forbidigo // polling a fake with a deadline
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubeadmCtxErr != nil || len(n.kubeadm) != 1 || n.kubeadm[0][1] != "apply" {
		t.Errorf("kubeadm ran %v with a context ended (%v): the node must finish what it started", n.kubeadm, n.kubeadmCtxErr)
	}
}

// TestDoorAnswersAdministratorsOnly is the attack: the join service (its
// client certificate, group gatehouse:verifiers), a node (system:nodes),
// a certificate of another CA and a caller without one all try to make a
// node upgrade. Each is refused at the TLS handshake and the node did
// nothing; an administrator (kubeadm:cluster-admins) is served.
func TestDoorAnswersAdministratorsOnly(t *testing.T) {
	ca, other := testkit.NewCA(t, "kubernetes"), testkit.NewCA(t, "another")
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testkit.LogBuffer
	door, err := atls.NewClientCertDoor(caFile, atls.AdministratorOrganizations(), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	serving := ca.Issue(t, "system:node:worker-1", true)
	n := &node{version: "v1.35.8"}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(door.TLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &serving, nil }))))
	upgradeagentv1.RegisterUpgradeAgentServiceServer(srv, newAgent(t, n, nil))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	call := func(cert *tls.Certificate) error {
		cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err = upgrade(ctx, upgradeagentv1.NewUpgradeAgentServiceClient(conn), request(upgradeagentv1.Step_STEP_NODE))
		return err
	}
	joinService := ca.IssueClient(t, "gatehouse-joinservice", "gatehouse:verifiers")
	kubelet := ca.IssueClient(t, "system:node:worker-2", "system:nodes")
	stranger := other.IssueClient(t, "alice", "kubeadm:cluster-admins")
	for _, tc := range []struct {
		name, reason string
		cert         *tls.Certificate
	}{
		{"the join service", atls.ReasonOrganization, &joinService},
		{"a node", atls.ReasonOrganization, &kubelet},
		{"another CA's administrator", atls.ReasonUntrustedCertificate, &stranger},
		{"no certificate", atls.ReasonAnonymous, nil},
	} {
		before := strings.Count(logs.String(), `"reason":"`+tc.reason+`"`)
		if err := call(tc.cert); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want the handshake refused (Unavailable)", tc.name, err)
		}
		if strings.Count(logs.String(), `"reason":"`+tc.reason+`"`) <= before {
			t.Errorf("%s: no refusal logged with reason %s:\n%s", tc.name, tc.reason, logs.String())
		}
	}
	if installed, kubeadm, restarts := n.changed(); len(installed)+len(kubeadm)+restarts != 0 {
		t.Fatalf("a refused caller changed the node: installed %v, kubeadm %v, restarts %d", installed, kubeadm, restarts)
	}
	admin := ca.IssueClient(t, "kubernetes-admin", "kubeadm:cluster-admins")
	if err := call(&admin); err != nil {
		t.Fatalf("an administrator: %v", err)
	}
	if _, kubeadm, _ := n.changed(); len(kubeadm) != 1 {
		t.Errorf("the administrator's request ran kubeadm %v", kubeadm)
	}
}

// FuzzCheck: any request the network can send is checked without a
// panic, and one that passes names exactly the three files under the
// install directory and a supported release.
func FuzzCheck(f *testing.F) {
	for _, step := range []upgradeagentv1.Step{upgradeagentv1.Step_STEP_APPLY, upgradeagentv1.Step_STEP_KUBELET} {
		b, err := proto.Marshal(request(step))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	s, err := New(Options{Installer: &node{}, Kubeadm: &node{}, Kubelet: &node{}, InstallDir: "/usr/local/bin"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &upgradeagentv1.UpgradeRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		p, err := s.check(req)
		if err != nil {
			return
		}
		if p.release.Version != req.GetKubernetesVersion() || len(p.kubeadm) != 1 || len(p.other) != 2 {
			t.Fatalf("accepted %v as %+v", req, p)
		}
		for _, c := range append(slices.Clone(p.kubeadm), p.other...) {
			if dir := filepath.Dir(c.GetInstallPath()); dir != "/usr/local/bin" || c.GetExtract() {
				t.Fatalf("accepted a component at %s", c.GetInstallPath())
			}
		}
	})
}
