package cli

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-tpm-tools/simulator"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"k8s.io/client-go/tools/clientcmd"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	initservicev1 "github.com/gatehouse-dev/gatehouse/api/initservice/v1"
	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/bootstrapper/nodelock"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

var bootArtefacts = append(roleArtefacts("control-plane"), tpm.BytesArtefact(4, "gatehouse-bootstrapper", []byte("bootstrapper v1")))

// roleArtefacts is what a node of role measures on its kernel command line
// into PCR 8 (docs/joinservice.md, "Roles from evidence").
func roleArtefacts(role string) []tpm.Artefact {
	return []tpm.Artefact{tpm.BytesArtefact(8, "kernel-cmdline", []byte("gatehouse.role="+role))}
}

// Fakes for what the node changes; the InitServer, the node lock and the
// attested TLS are real.
type memDisk struct{}

func (memDisk) UUID(context.Context) (string, error) {
	return "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b", nil
}
func (memDisk) Rekey(context.Context, []byte, []byte) error              { return nil }
func (memDisk) MarkInitialised(context.Context, []byte) error            { return nil }
func (memDisk) MarkForReset(context.Context) error                       { return nil }
func (memDisk) Install(context.Context, []*componentsv1.Component) error { return nil }

type fakeKubeadm struct {
	mu    sync.Mutex
	calls []string
	fail  bool
}

func (k *fakeKubeadm) Run(_ context.Context, args ...string) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, args[0])
	if k.fail && args[0] == "init" {
		return []byte("[kubelet-check] the kubelet is not healthy"), fmt.Errorf("exit status 1")
	}
	return nil, nil
}

// node serves InitService like a booted node: simulated TPM, real
// InitServer over attested TLS.
type node struct {
	addr string
	// evidence serves the node's evidence (atls.ServeEvidence).
	evidence string
	akPEM    string
	// ekRoots, when set, is its TPM manufacturer's CA bundle (PEM): the
	// configuration trusts that instead of pinning akPEM.
	ekRoots string
	// hardware, when set, are config generate's variant flags (sev-snp,
	// tdx) instead of a key trust flag, and patch edits the generated file.
	hardware []string
	patch    func(config string) string
	lock     *nodelock.Lock
	kubeadm  *fakeKubeadm
	secret   string
	// root is the node's file system root.
	root string
}

// testPCRs is what the test nodes quote.
var testPCRs = []int{0, 4, 8, 15}

func startNode(t *testing.T) *node {
	t.Helper()
	sim, a := bootSimulator(t)
	return startNodeOn(t, sim, a)
}

// bootSimulator measures bootArtefacts into this process's TPM simulator
// and returns it with an attester quoting testPCRs; both close when t ends.
func bootSimulator(t *testing.T) (io.ReadWriter, *tpmattester.QuoteAttester) {
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
	return sim, a
}

// startNodeOn serves InitService and evidence as a node whose TPM is rw,
// attesting with a.
func startNodeOn(t *testing.T, rw io.ReadWriter, a *tpmattester.QuoteAttester) *node {
	t.Helper()
	return startNodeAs(t, rw, a, a)
}

// startNodeAs is startNodeOn with evidence from attester (a confidential
// VM's, whose vTPM is a).
func startNodeAs(t *testing.T, rw io.ReadWriter, a *tpmattester.QuoteAttester, attester attestation.Attester) *node {
	t.Helper()
	lock, err := nodelock.New(rw)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{lock: lock, kubeadm: &fakeKubeadm{}, secret: "init-secret-of-the-test"}
	hash, err := bcrypt.GenerateFromPassword([]byte(n.secret), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	n.root = t.TempDir()
	setup := &bootstrapper.Machine{
		Root: n.root, Disk: memDisk{}, FirstBootKey: []byte("first"), Installer: memDisk{}, Kubeadm: n.kubeadm,
		Node: kubeadm.Node{Name: "cp-0", AdvertiseAddress: "192.0.2.10"}, Log: slog.New(slog.DiscardHandler),
	}
	identity, err := a.Identity()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := bootstrapper.NewInitServer(bootstrapper.InitServerConfig{Machine: setup, Lock: lock, Identity: identity, InitSecretHash: hash,
		// kubeadm is recorded: there is no cluster to bind the name in.
		BindName: func(context.Context, string, string, string) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := atls.NewCredentials(atls.Config{Attester: attester})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(creds))
	initservicev1.RegisterInitServiceServer(g, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	n.addr = lis.Addr().String()
	elis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = atls.ServeEvidence(t.Context(), elis, attester) }()
	n.evidence = elis.Addr().String()
	n.akPEM = akPEM(t, a)
	return n
}

// akPEM returns a's attestation key as PEM, as a policy pins it.
func akPEM(t *testing.T, a *tpmattester.QuoteAttester) string {
	t.Helper()
	spki, err := x509.MarshalPKIXPublicKey(a.AttestationKey())
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}))
}

// writeConfig runs `config generate` for n's boot and AK into dir.
func writeConfig(t *testing.T, dir string, n *node, tamper bool) string {
	t.Helper()
	return writeConfigRoles(t, dir, n, tamper, map[string]string{"control-plane": "control-plane", "worker": "worker"})
}

// writeConfigRoles is writeConfig with the role each option's values come
// from: {"control-plane": "worker"} makes the policy expect of a control
// plane what a worker measures.
func writeConfigRoles(t *testing.T, dir string, n *node, tamper bool, measuredAs map[string]string) string {
	t.Helper()
	ref, err := tpm.ReferenceValues(bootArtefacts, []int{0, 4})
	if err != nil {
		t.Fatal(err)
	}
	if tamper {
		m := ref[4]
		m.Expected = bytes.Repeat([]byte{0xee}, 32)
		ref[4] = m
	}
	refJSON, err := ref.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	refFile, akFile := filepath.Join(dir, "refs.json"), filepath.Join(dir, "ak.pem")
	if err := os.WriteFile(refFile, refJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	roleFiles := map[string]string{}
	for _, role := range []string{"control-plane", "worker"} {
		ref, err := tpm.ReferenceValues(roleArtefacts(measuredAs[role]), []int{8})
		if err != nil {
			t.Fatal(err)
		}
		data, err := ref.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		roleFiles[role] = filepath.Join(dir, role+".json")
		if err := os.WriteFile(roleFiles[role], data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{"--pinned-ak", akFile}
	if n.ekRoots != "" {
		keys = []string{"--ek-roots", filepath.Join(dir, "ek-roots.pem")}
		if err := os.WriteFile(keys[1], []byte(n.ekRoots), 0o600); err != nil {
			t.Fatal(err)
		}
	} else if err := os.WriteFile(akFile, []byte(n.akPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	if n.hardware != nil {
		keys = n.hardware
	}
	out := filepath.Join(dir, clusterconfig.DefaultPath)
	run(t, append([]string{"config", "generate", "--output", out, "--reference-values", refFile, "--pcrs", "0,4,8,15", "--name", "test",
		"--control-plane-reference-values", roleFiles["control-plane"], "--worker-reference-values", roleFiles["worker"]}, keys...)...)
	if n.patch != nil {
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, []byte(n.patch(string(data))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// run runs the CLI with args and returns its output; it fails the test on
// an error.
func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runErr(t, args...)
	if err != nil {
		t.Fatalf("gatehouse %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

func TestInit(t *testing.T) {
	n := startNode(t)
	dir := t.TempDir()
	t.Chdir(dir)
	config := writeConfig(t, dir, n, false)
	if err := os.WriteFile("secret", []byte(n.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := run(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret")
	for _, want := range []string{"[node-lock]", "[kubeadm-init]", "[admin-kubeconfig]", "is initialised", clusterconfig.DefaultKubeconfig} {
		if !strings.Contains(out, want) {
			t.Errorf("init output lacks %q:\n%s", want, out)
		}
	}
	for file, mode := range map[string]os.FileMode{clusterconfig.DefaultKubeconfig: 0o600, clusterconfig.DefaultMasterSecretFile: 0o600, clusterconfig.DefaultStateFile: 0o600} {
		fi, err := os.Stat(file)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, mode %v; want %v", file, err, fi.Mode().Perm(), mode)
		}
	}
	if _, err := clientcmd.LoadFromFile(clusterconfig.DefaultKubeconfig); err != nil {
		t.Error(err)
	}
	state, err := clusterconfig.ReadState(clusterconfig.DefaultStateFile)
	if err != nil {
		t.Fatal(err)
	}
	if state.Phase != "initialised" || len(state.ClusterID) != 64 || !n.lock.Locked() {
		t.Fatalf("state %+v, node locked %v", state, n.lock.Locked())
	}
	if _, err := hex.DecodeString(state.MeasurementSalt); err != nil {
		t.Fatal(err)
	}

	// Again: the cluster exists, and the master secret is never overwritten.
	secretBefore, _ := os.ReadFile(clusterconfig.DefaultMasterSecretFile)
	if out, err := runErr(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret"); err == nil || !strings.Contains(err.Error(), "already initialised") {
		t.Fatalf("second init: %v\n%s", err, out)
	}
	if secretAfter, _ := os.ReadFile(clusterconfig.DefaultMasterSecretFile); !bytes.Equal(secretBefore, secretAfter) {
		t.Fatal("the master secret file changed")
	}
	if err := os.Remove(clusterconfig.DefaultStateFile); err != nil {
		t.Fatal(err)
	}
	if _, err := runErr(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret"); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("init over an existing master secret file: %v", err)
	}
}

// TestInitRefusesTamperedNode: a node whose measurements differ from the
// configuration gets nothing, and init says why without retrying.
// TestInitAndVerifyEKEndorsedNode: a configuration trusting the node's
// TPM manufacturer (no key of the node registered) initialises it and
// verifies it; the CLI checks the credential activation inside the
// handshake. A configuration naming another manufacturer refuses it
// before anything is sent.
func TestInitAndVerifyEKEndorsedNode(t *testing.T) {
	ca := swtpmtest.CA(t)
	m := swtpmtest.Manufacture(t, ca, testPCRs, func(sw *swtpm.TPM) error {
		rw, err := sw.Open()
		if err != nil {
			return err
		}
		defer rw.Close()
		_, err = tpmattester.MeasureBoot(rw, bootArtefacts)
		return err
	})
	rw, err := m.TPM.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	n := startNodeOn(t, rw, m.Attester)
	root, inter, err := ca.Roots()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("secret", []byte(n.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	otherRoot, _, err := swtpmtest.CA(t).Roots()
	if err != nil {
		t.Fatal(err)
	}
	n.ekRoots = string(otherRoot)
	other := writeConfig(t, t.TempDir(), n, false)
	if out, err := runErr(t, "init", "--config", other, "--node", n.addr, "--init-secret-file", "secret", "--state-file", "other-state.json",
		"--master-secret-file", "other-master.json", "--kubeconfig-out", "other.kubeconfig"); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("init trusting another manufacturer: %v\n%s", err, out)
	}
	if n.lock.Locked() || len(n.kubeadm.calls) != 0 {
		t.Fatal("the node was initialised by a CLI that should not trust it")
	}

	n.ekRoots = string(root) + string(inter)
	config := writeConfig(t, dir, n, false)
	if out := run(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret"); !strings.Contains(out, "is initialised") {
		t.Fatalf("init output:\n%s", out)
	}
	out := run(t, "verify", "--config", config, "--node", n.evidence, "--output", "json")
	var report struct {
		Endorsement string `json:"endorsement"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || !strings.HasPrefix(report.Endorsement, "ek-certificate manufacturer=id:00001014") {
		t.Fatalf("verify report %s (%v): want the EK certificate named", out, err)
	}
}

func TestInitRefusesTamperedNode(t *testing.T) {
	n := startNode(t)
	dir := t.TempDir()
	t.Chdir(dir)
	config := writeConfig(t, dir, n, true)
	if err := os.WriteFile("secret", []byte(n.secret), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret")
	if err == nil || !strings.Contains(err.Error(), "did not prove it runs what the configuration expects") || !strings.Contains(err.Error(), "index 4") {
		t.Fatalf("init of a tampered node: %v\n%s", err, out)
	}
	if strings.Contains(out, "retrying") || n.lock.Locked() || len(n.kubeadm.calls) != 0 {
		t.Fatalf("the tampered node was retried or changed:\n%s", out)
	}
}

// TestInitRefusesNodeWithoutControlPlaneRole: the first node becomes a
// control plane, so init verifies its evidence with the control-plane
// role's reference values; a node proving only the worker role is refused
// before anything is sent to it.
func TestInitRefusesNodeWithoutControlPlaneRole(t *testing.T) {
	n := startNode(t)
	dir := t.TempDir()
	t.Chdir(dir)
	// The node measures the control-plane role; this policy calls that a worker.
	config := writeConfigRoles(t, dir, n, false, map[string]string{"control-plane": "worker", "worker": "control-plane"})
	if err := os.WriteFile("secret", []byte(n.secret), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret")
	if err == nil || !strings.Contains(err.Error(), "role controlPlane") {
		t.Fatalf("init of a node proving only the worker role: %v\n%s", err, out)
	}
	if n.lock.Locked() || len(n.kubeadm.calls) != 0 {
		t.Fatalf("the node was changed:\n%s", out)
	}
}

// TestInitFailureShowsLogs: a failed init reports the node's error and
// saves its logs.
func TestInitFailureShowsLogs(t *testing.T) {
	n := startNode(t)
	n.kubeadm.fail = true
	dir := t.TempDir()
	t.Chdir(dir)
	config := writeConfig(t, dir, n, false)
	if err := os.WriteFile("secret", []byte(n.secret), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret")
	if err == nil || !strings.Contains(err.Error(), "kubeadm init failed") {
		t.Fatalf("failed init: %v\n%s", err, out)
	}
	logs, rerr := os.ReadFile("gatehouse-init-failure.log")
	if rerr != nil || !strings.Contains(string(logs), "the kubelet is not healthy") {
		t.Fatalf("failure log: %v\n%s", rerr, logs)
	}
}

func TestInitWaitsForUnreachableNode(t *testing.T) {
	n := startNode(t)
	dir := t.TempDir()
	t.Chdir(dir)
	config := writeConfig(t, dir, n, false)
	if err := os.WriteFile("secret", []byte(n.secret), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(t, "init", "--config", config, "--node", "127.0.0.1:1", "--init-secret-file", "secret", "--timeout", "1500ms")
	if err == nil || !strings.Contains(err.Error(), "giving up") || !strings.Contains(out, "not reachable") {
		t.Fatalf("unreachable node: %v\n%s", err, out)
	}
}

func TestConfigGenerate(t *testing.T) {
	n := startNode(t)
	dir := t.TempDir()
	config := writeConfig(t, dir, n, false)
	cfg, err := clusterconfig.Load(config)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name != "test" || cfg.KubernetesVersion == "" {
		t.Fatalf("config %+v", cfg)
	}
	data, _ := os.ReadFile(config)
	if !strings.Contains(string(data), "# Kubernetes version") {
		t.Fatalf("the configuration has no comments:\n%s", data)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"config", "generate", "--output", config}, "--reference-values, --control-plane-reference-values and (for tpm) one of --ek-roots, --gce-project and --pinned-ak"},
		{[]string{"config", "generate", "--output", filepath.Join(dir, "x.yaml"), "--reference-values", filepath.Join(dir, "refs.json"), "--control-plane-reference-values", filepath.Join(dir, "control-plane.json"), "--pinned-ak", filepath.Join(dir, "ak.pem"), "--kubernetes-version", "1.20"}, "not supported"},
		{[]string{"config", "generate", "--output", config, "--reference-values", filepath.Join(dir, "refs.json"), "--control-plane-reference-values", filepath.Join(dir, "control-plane.json"), "--pinned-ak", filepath.Join(dir, "ak.pem")}, "exists"},
		{[]string{"config", "generate", "--output", filepath.Join(dir, "y.yaml"), "--reference-values", filepath.Join(dir, "refs.json"), "--control-plane-reference-values", filepath.Join(dir, "control-plane.json"), "--pinned-ak", filepath.Join(dir, "ak.pem"), "--pcrs", "0,4,8"}, "must include the node-lock PCR 15"},
		{[]string{"config", "generate", "--output", filepath.Join(dir, "z.yaml"), "--reference-values", filepath.Join(dir, "refs.json"), "--control-plane-reference-values", filepath.Join(dir, "control-plane.json"), "--pinned-ak", filepath.Join(dir, "ak.pem"), "--pod-cidr", "10.96.0.0/16"}, "overlap"},
	} {
		if out, err := runErr(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v (%s), want an error containing %q", tc.args, err, out, tc.want)
		}
	}
}

// TestConfigGenerateVariants: --attestation writes each variant's
// commented section, which loads and compiles; wrong flag combinations
// are errors naming what is missing.
func TestConfigGenerateVariants(t *testing.T) {
	n := startNode(t)
	dir := t.TempDir()
	writeConfig(t, dir, n, false) // writes refs.json and control-plane.json
	refs := []string{"--reference-values", filepath.Join(dir, "refs.json"), "--control-plane-reference-values", filepath.Join(dir, "control-plane.json")}
	m48 := strings.Repeat("ab", 48)
	for _, tc := range []struct {
		variant string
		args    []string
		want    []string
	}{
		{"sev-snp", []string{"--launch-measurement", m48, "--snp-minimum-tcb", "3.0.8.115"}, []string{"variant: sev-snp", "sevSnp:", "# guestPolicy:", "# idKeyDigests:", "checkRevocations: true"}},
		{"azure-sev-snp", []string{"--launch-measurement", m48, "--snp-minimum-tcb", "3.0.8.115"}, []string{"variant: azure-sev-snp", "sevSnp:", "checkRevocations: true"}},
		{"tdx", []string{"--mrtd", m48}, []string{"variant: tdx", "tdx:", "# rtmrs:", "# mrSeam:", "# minimumTeeTcbSvn:"}},
		{"gcp-vtpm", []string{"--gce-project", "my-project"}, []string{"variant: tpm", "gce:", "projects: [\"my-project\"]"}},
	} {
		t.Run(tc.variant, func(t *testing.T) {
			out := filepath.Join(dir, tc.variant+".yaml")
			run(t, append(append([]string{"config", "generate", "--output", out, "--attestation", tc.variant}, refs...), tc.args...)...)
			cfg, err := clusterconfig.Load(out)
			if err != nil {
				t.Fatal(err)
			}
			a, err := cfg.Appraisal(nil)
			if err != nil {
				t.Fatalf("the generated %s policy does not compile: %v", tc.variant, err)
			}
			data, _ := os.ReadFile(out)
			for _, w := range tc.want {
				if !strings.Contains(string(data), w) {
					t.Errorf("the generated configuration lacks %q:\n%s", w, data)
				}
			}
			if wantVariant := strings.TrimPrefix(tc.want[0], "variant: "); string(a.Variant()) != wantVariant {
				t.Errorf("variant %s, want %s", a.Variant(), wantVariant)
			}
		})
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--attestation", "sev-snp"}, "--attestation sev-snp needs --launch-measurement"},
		{[]string{"--attestation", "sev-snp", "--launch-measurement", m48, "--snp-minimum-tcb", "new"}, "--snp-minimum-tcb \"new\": want BOOTLOADER.TEE.SNP.MICROCODE"},
		{[]string{"--attestation", "sev-snp", "--launch-measurement", m48, "--snp-minimum-tcb", "1.0.1.1", "--gce-project", "p"}, "trusts the vTPM key the hardware report binds"},
		{[]string{"--attestation", "tdx"}, "--attestation tdx needs --mrtd"},
		{[]string{"--attestation", "tpm", "--mrtd", m48, "--gce-project", "p"}, "--mrtd is for --attestation tdx"},
		{[]string{"--attestation", "gcp-vtpm"}, "--attestation gcp-vtpm needs --gce-project"},
		{[]string{"--attestation", "nitro"}, "use tpm, gcp-vtpm, sev-snp, azure-sev-snp or tdx"},
		{[]string{"--attestation", "azure-sev-snp"}, "--attestation azure-sev-snp needs --launch-measurement"},
		{[]string{"--attestation", "sev-snp", "--launch-measurement", "abcd", "--snp-minimum-tcb", "1.0.1.1"}, "launchMeasurements[0] has 2 bytes, want 48"},
	} {
		args := append(append([]string{"config", "generate", "--output", filepath.Join(dir, "bad.yaml")}, refs...), tc.args...)
		if out, err := runErr(t, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v (%s), want an error containing %q", tc.args, err, out, tc.want)
		}
	}
}

func TestCompletion(t *testing.T) {
	if out := run(t, "completion", "bash"); !strings.Contains(out, "bash completion") {
		t.Fatalf("completion bash:\n%.200s", out)
	}
}
