package joinservice

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/grpcopts"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek/kektest"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
	"github.com/gatehouse-dev/gatehouse/keyservice"
)

// Names of the test's ConfigMaps, in testNamespace.
const (
	testJoinConfig = "gatehouse-join-config"
	testDenyList   = "gatehouse-deny-list"
	testNamespace  = "gatehouse-system"
)

// rolePCR is where test nodes measure their role, as a real node's kernel
// command line is measured (docs/joinservice.md, "Roles from evidence").
const rolePCR = 8

// testPCRs is the quoted selection: firmware, boot loader (the
// bootstrapper's measurement), the role and the node-lock PCR.
var testPCRs = []int{0, 4, rolePCR, keys.NodeLockPCR}

// testNodeCIDR holds the addresses test nodes put in their CSRs: they
// connect from loopback, which a kubelet certificate may not name.
const testNodeCIDR = "10.0.0.0/8"

// bootArtefacts are what the simulated nodes of role "boot".
func bootArtefacts(role policy.Role) []tpm.Artefact {
	return []tpm.Artefact{
		tpm.BytesArtefact(4, "gatehouse-bootstrapper", []byte("bootstrapper v1")),
		tpm.BytesArtefact(rolePCR, "kernel-cmdline", []byte("gatehouse.role="+string(role))),
	}
}

// node is the simulated TPM most test nodes attest with, booted as a
// worker. The go-tpm-tools simulator is one per process, so all nodes of a
// test using it share it: they differ in node name and disk, not in AK.
// swtpmNode gives a test another identity, and a control plane.
type node struct {
	attester *tpmattester.QuoteAttester
}

func newNode(t testing.TB) *node {
	t.Helper()
	a, closeSim, err := bootNode()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeSim)
	return &node{attester: a}
}

// bootNode opens this process's TPM simulator, measures bootArtefacts into
// it and returns an attester quoting testPCRs, and what closes both.
func bootNode() (*tpmattester.QuoteAttester, func(), error) {
	sim, err := simulator.Get()
	if err != nil {
		return nil, nil, err
	}
	if _, err := tpmattester.MeasureBoot(sim, bootArtefacts(policy.RoleWorker)); err != nil {
		_ = sim.Close()
		return nil, nil, err
	}
	a, err := tpmattester.New(sim, tpmattester.Options{PCRs: testPCRs})
	if err != nil {
		_ = sim.Close()
		return nil, nil, err
	}
	return a, func() { _ = a.Close(); _ = sim.Close() }, nil
}

// swtpmNode boots a node of role on its own swtpm, a separate TPM with its
// own attestation identity, and returns its attester. The harness does not
// trust it until h.trust.
func swtpmNode(t testing.TB, role policy.Role) *tpmattester.QuoteAttester {
	t.Helper()
	rw := swtpmtest.Boot(t, t.TempDir(), bootArtefacts(role))
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// trust pins the AKs of attesters in the join config and waits until the
// service applied it.
func (h *harness) trust(t testing.TB, attesters ...*tpmattester.QuoteAttester) {
	t.Helper()
	for _, a := range attesters {
		h.extraAKs = append(h.extraAKs, a.AttestationKey())
	}
	h.applyJoinConfig(t, h.joinConfigData(t, nil))
}

// applyJoinConfig writes the join config and waits until the service has
// applied this version.
func (h *harness) applyJoinConfig(t testing.TB, data map[string]string) {
	t.Helper()
	applied := testutil.ToFloat64(h.server.cfg.PolicyStore.reloads.WithLabelValues(testJoinConfig, "applied"))
	h.putConfigMap(t, testJoinConfig, data)
	h.waitReloads(t, testJoinConfig, "applied", applied+1)
}

// identity returns the attestation identity of a.
func identity(t testing.TB, a *tpmattester.QuoteAttester) string {
	t.Helper()
	id, err := a.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// harness is a join service on loopback against a real API server and
// kube-controller-manager, with a real key service over mutual TLS.
type harness struct {
	env           *testenv.Env
	client        kubernetes.Interface
	node          *node
	addr          string
	caHash        string
	pkiDir        string
	logs          *testkit.LogBuffer
	reg           *prometheus.Registry
	keysReg       *prometheus.Registry
	server        *Server
	keyAddr       string
	keyServiceDir string
	// keyGRPC serves the key service at keyAddr; newKeyGRPC makes another
	// server of the same key service (restartKeyService).
	keyGRPC    *grpc.Server
	newKeyGRPC func() *grpc.Server
	masterKey  []byte
	masterSalt []byte
	salt       []byte
	// extraAKs are trusted besides the node's (the benchmark's rig process).
	extraAKs []crypto.PublicKey
	// ekRoots and ekIntermediates, when set, replace the pinned AKs: the
	// policy trusts TPMs of that manufacturer (PEM bundles).
	ekRoots, ekIntermediates string
	// variant and hardware: see harnessOptions.
	variant  attestation.Variant
	hardware map[string]any
}

type harnessOptions struct {
	rate       connlimit.Rate
	discardLog bool
	limits     ConnectionLimits
	// listen limits new connections; zero is generous (the storm connects
	// 200 nodes from distinct sources at once).
	listen connlimit.Limits
	// variant is the join policy's; "" is tpm. sev-snp and tdx take their
	// hardware section (the policy's sevSnp or tdx) from hardware.
	variant  attestation.Variant
	hardware map[string]any
	// awsKMS keeps the key service's master secret wrapped by a real AWS
	// KMS API server (local-kms), as kms://aws-kms does, instead of plain.
	awsKMS bool
}

func newHarness(t testing.TB, opts harnessOptions) *harness {
	t.Helper()
	if opts.rate == (connlimit.Rate{}) {
		opts.rate = connlimit.Rate{Rate: 1000, Burst: 1000}
	}
	env := testenv.New(t, testenv.Options{ControllerManager: true})
	ctx := t.Context()
	client, err := kubernetes.NewForConfig(apiClientConfig(env))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.PublishClusterInfo(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if opts.variant == "" {
		opts.variant = attestation.VariantTPM
	}
	h := &harness{
		env: env, client: client, node: newNode(t), variant: opts.variant, hardware: opts.hardware,
		logs:    &testkit.LogBuffer{Discard: opts.discardLog},
		reg:     prometheus.NewRegistry(),
		keysReg: prometheus.NewRegistry(),
		salt:    randomBytes(t, keys.MeasurementSaltSize),
	}
	h.pkiDir = writeControlPlanePKI(t, env)
	h.startKeyService(t, opts.awsKMS)
	h.putConfigMap(t, testJoinConfig, h.joinConfigData(t, nil))

	log := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	policy, err := NewPolicyStore(opts.variant, time.Now, log, h.reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := policy.Watch(ctx, client, testNamespace, testJoinConfig, testDenyList); err != nil {
		t.Fatal(err)
	}
	ca, err := clusterpki.LoadCA(filepath.Join(h.pkiDir, "ca.crt"), filepath.Join(h.pkiDir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	h.caHash = ca.DiscoveryTokenCACertHash()
	keyConn := h.dialKeyService(t)
	credentialGate, boundNames := startGate(t, client, policy, log, h.reg)
	h.server, err = NewServer(Config{
		PolicyStore:      policy,
		Gate:             credentialGate,
		BoundNames:       boundNames,
		Keys:             NewKeyServiceKeys(keyConn),
		Tokens:           NewTokens(client, time.Now),
		ControlPlaneLock: NewControlPlaneLock(client, testNamespace, ControlPlaneJoinTimeout, time.Now),
		Bindings:         nodebinding.New(client, testNamespace, time.Now),
		CA:               ca,
		// The cluster's kubelet certificate lifetime (TestJoin).
		KubeletCertLifetime: 90 * time.Minute,
		PKIDir:              h.pkiDir,
		RateLimit:           opts.rate,
		Log:                 log,
		Registerer:          h.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := ServerCredentials(policy, clusterpki.NewIdentity(ca, time.Now), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if opts.listen == (connlimit.Limits{}) {
		opts.listen = connlimit.Limits{Handshakes: connlimit.Rate{Rate: 1000, Burst: 1000}}
	}
	lis, err := h.server.Listen(inner, opts.listen)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewGRPCServer(h.server, creds, opts.limits)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	h.addr = lis.Addr().String()
	return h
}

// startGate starts the caches the credential gate reads (the attestation
// records, the Nodes, and the bindings for a rejoin's node names), waits
// for them, and returns the gate, as cmd/gatehouse-joinservice does.
func startGate(t testing.TB, client kubernetes.Interface, policy *PolicyStore, log *slog.Logger, reg prometheus.Registerer) (*gate.Gate, *nodebinding.Cache) {
	t.Helper()
	records := nodeattestation.NewCache(client, testNamespace)
	nodes := continuous.NewNodeCache(client)
	bindings := nodebinding.NewCache(client, testNamespace)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, c := range []interface {
		Start(context.Context)
		WaitForCacheSync(context.Context) error
	}{records, nodes, bindings} {
		c.Start(t.Context())
		if err := c.WaitForCacheSync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	g, err := gate.New(policy, records, nodes, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	return g, bindings
}

// apiClientConfig is the client configuration of the join service and of
// the raw-rate baseline: the administrator's, with client-go's own rate
// limit raised out of the way (QPS 1000, burst 2000), so both measure the
// API server rather than the client's throttle, and the service's bound
// on requests in flight (LimitAPIRequests), as cmd/gatehouse-joinservice
// sets it.
func apiClientConfig(env *testenv.Env) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.Wrap(LimitAPIRequests(MaxAPIRequestsInFlight))
	return cfg
}

// writeControlPlanePKI copies the environment's cluster CA and service
// account keys into a PKI directory laid out as kubeadm's and adds the
// front-proxy and etcd CAs a control plane also needs.
func writeControlPlanePKI(t testing.TB, env *testenv.Env) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"ca.crt", "ca.key", "sa.key", "sa.pub"} {
		data, err := os.ReadFile(filepath.Join(env.Dir, "pki", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "etcd"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"front-proxy-ca", "etcd/ca"} {
		ca := testkit.NewCA(t, name)
		testkit.WritePEM(t, filepath.Dir(filepath.Join(dir, name)), filepath.Base(name),
			tls.Certificate{Certificate: [][]byte{ca.Cert.Raw}, PrivateKey: ca.Key})
	}
	return dir
}

// startKeyService runs the real key service on loopback with mutual TLS:
// its master secret plain (cluster KMS), or wrapped by a real AWS KMS API
// server.
func (h *harness) startKeyService(t testing.TB, awsKMS bool) {
	t.Helper()
	h.masterKey, h.masterSalt = randomBytes(t, 32), randomBytes(t, 32)
	salt := h.masterSalt
	var keys interface {
		GetDataKey(ctx context.Context, id string, length int) ([]byte, error)
	}
	keys, err := kms.NewClusterKMS(h.masterKey, salt)
	if err != nil {
		t.Fatal(err)
	}
	if awsKMS {
		keys = wrappedKeys(t, h.masterKey, salt)
	}
	internalCA := testkit.NewCA(t, "gatehouse-internal-ca")
	dir := t.TempDir()
	certFile, keyFile := testkit.WritePEM(t, dir, "keyservice", internalCA.Issue(t, "gatehouse-keyservice", true))
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, internalCA.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.WritePEM(t, dir, "joinservice", internalCA.Issue(t, "gatehouse-joinservice", false))
	tlsCfg, err := keyservice.ServerTLSConfig(keyservice.TLSFiles{Cert: certFile, Key: keyFile, ClientCA: caFile}, []string{"gatehouse-joinservice"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := keyservice.NewServer(keys, slog.New(slog.NewJSONHandler(h.logs, nil)), h.keysReg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.newKeyGRPC = func() *grpc.Server { return keyservice.NewGRPCServer(srv, credentials.NewTLS(tlsCfg)) }
	g := h.newKeyGRPC()
	h.keyGRPC = g
	go func() { _ = g.Serve(lis) }()
	// Whichever server runs at the end (restartKeyService replaces it).
	t.Cleanup(func() { h.keyGRPC.Stop() })
	h.keyAddr = lis.Addr().String()
	h.keyServiceDir = dir
}

// stopKeyService stops the key service as a crash would: its listener and
// every connection closed at once, requests in flight failed.
func (h *harness) stopKeyService() error {
	h.keyGRPC.Stop()
	return nil
}

// restartKeyService serves the same key service (same keys and
// certificates) at the same address again, after stopKeyService.
func (h *harness) restartKeyService(context.Context) error {
	lis, err := net.Listen("tcp", h.keyAddr)
	if err != nil {
		return fmt.Errorf("listening at the key service's address again: %w", err)
	}
	g := h.newKeyGRPC()
	h.keyGRPC = g
	go func() { _ = g.Serve(lis) }()
	return nil
}

func (h *harness) dialKeyService(t testing.TB) *grpc.ClientConn {
	t.Helper()
	tlsCfg, err := KeyServiceTLSConfig(filepath.Join(h.keyServiceDir, "joinservice.crt"),
		filepath.Join(h.keyServiceDir, "joinservice.key"), filepath.Join(h.keyServiceDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := DialKeyService(h.keyAddr, tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// keyRequests returns how many requests the key service has answered.
func (h *harness) keyRequests(t testing.TB) float64 {
	t.Helper()
	mfs, err := h.keysReg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "gatehouse_keyservice_requests_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// verdicts returns gatehouse_joinservice_verdicts_total for method,
// verdict and reason.
func (h *harness) verdicts(t testing.TB, method, verdict, reason string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"method": method, "verdict": verdict, "reason": reason}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "gatehouse_joinservice_verdicts_total" {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// joinConfigData returns a valid join config trusting the node's AK (and
// h.extraAKs) and expecting what nodes boot: common PCRs 0 and 4, and PCR
// rolePCR per role; override replaces common reference values.
func (h *harness) joinConfigData(t testing.TB, override map[uint32]string) map[string]string {
	t.Helper()
	values := referenceValues(t, bootArtefacts(policy.RoleWorker), 0, 4)
	for i, v := range override {
		values[fmt.Sprint(i)] = map[string]any{"expected": v}
	}
	roles := map[policy.Role]any{}
	for _, r := range []policy.Role{policy.RoleControlPlane, policy.RoleWorker} {
		roles[r] = map[string]any{"referenceValues": referenceValues(t, bootArtefacts(r), rolePCR)}
	}
	var pinned []string
	for _, ak := range append([]crypto.PublicKey{h.node.attester.AttestationKey()}, h.extraAKs...) {
		spki, err := x509.MarshalPKIXPublicKey(ak)
		if err != nil {
			t.Fatal(err)
		}
		pinned = append(pinned, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki})))
	}
	doc := map[string]any{
		"variant":         "tpm",
		"pcrs":            testPCRs,
		"referenceValues": values,
		"roles":           roles,
		"pinnedAKs":       pinned,
	}
	if h.ekRoots != "" {
		delete(doc, "pinnedAKs")
		doc["ekRoots"], doc["ekIntermediates"] = h.ekRoots, h.ekIntermediates
	}
	if h.variant != attestation.VariantTPM {
		delete(doc, "pinnedAKs")
		doc["variant"] = string(h.variant)
		maps.Copy(doc, h.hardware)
	}
	policy, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	components, err := json.Marshal([]map[string]any{{
		"url":         "https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet",
		"hash":        "sha256:" + strings.Repeat("ab", 32),
		"installPath": "/run/state/bin/kubelet",
	}})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		joinconfig.KeyAttestation:          string(policy),
		joinconfig.KeyMeasurementSalt:      hex.EncodeToString(h.salt),
		joinconfig.KeyAPIServerEndpoint:    strings.TrimPrefix(h.env.APIServerURL, "https://"),
		joinconfig.KeyKubernetesVersion:    "v1.36.4",
		joinconfig.KeyKubernetesComponents: string(components),
		joinconfig.KeyNodeCIDRs:            testNodeCIDR,
		joinconfig.KeyImageMirror:          testImageMirror,
	}
}

// testImageMirror is the join config's image mirror, which every ticket
// carries.
const testImageMirror = `{"registry":"mirror.example:5000","plainHttp":true,"upstreams":["registry.k8s.io","docker.io"]}`

// referenceValues returns, in the policy's file form, the values artefacts
// leave in pcrs.
func referenceValues(t testing.TB, artefacts []tpm.Artefact, pcrs ...int) map[string]map[string]any {
	t.Helper()
	ref, err := tpm.ReferenceValues(artefacts, pcrs)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]map[string]any{}
	for i, m := range ref {
		values[fmt.Sprint(i)] = map[string]any{"expected": hex.EncodeToString(m.Expected)}
	}
	return values
}

// putConfigMap creates or replaces a ConfigMap in testNamespace.
func (h *harness) putConfigMap(t testing.TB, name string, data map[string]string) *corev1.ConfigMap {
	t.Helper()
	cms := h.client.CoreV1().ConfigMaps(testNamespace)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace}, Data: data}
	existing, err := cms.Get(t.Context(), name, metav1.GetOptions{})
	if err == nil {
		existing.Data = data
		cm, err = cms.Update(t.Context(), existing, metav1.UpdateOptions{})
	} else {
		cm, err = cms.Create(t.Context(), cm, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// waitReloads polls until the reload counter of configmap/result reaches n.
func (h *harness) waitReloads(t testing.TB, configmap, result string, n float64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return testutil.ToFloat64(h.server.cfg.PolicyStore.reloads.WithLabelValues(configmap, result)) >= n, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s %s reload #%v: %v", configmap, result, n, err)
	}
}

// dial returns a join service client attesting with the test node, from
// source address src (a 127.0.0.0/8 address; "" for any).
func (h *harness) dial(t testing.TB, attester attestation.Attester, src string) joinservicev1.JoinServiceClient {
	t.Helper()
	conn, err := dialJoinService(h.addr, h.caHash, attester, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return joinservicev1.NewJoinServiceClient(conn)
}

// dialJoinService returns a connection to the join service at addr,
// attesting with attester (nil: not at all) from source address src.
func dialJoinService(addr, caHash string, attester attestation.Attester, src string) (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials
	var err error
	if attester != nil {
		creds, err = joinerCredentials(attester, caHash)
	} else {
		creds, err = unattestedCredentials(caHash)
	}
	if err != nil {
		return nil, err
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, grpcopts.Dial()...)
	if src != "" {
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		}))
	}
	return grpc.NewClient(addr, opts...)
}

// unattestedCredentials verify the join service like a joiner but do not
// attest: what an impostor without a TPM can do.
func unattestedCredentials(caHash string) (credentials.TransportCredentials, error) {
	verify, err := clusterpki.VerifyClusterIdentity(caHash, time.Now)
	if err != nil {
		return nil, err
	}
	return atls.NewCredentials(atls.Config{VerifyPeer: verify})
}

// nodeCSR returns a kubelet CSR for name and its key.
func nodeCSR(t testing.TB, name string, ip net.IP) ([]byte, crypto.Signer) {
	t.Helper()
	der, key, err := newNodeCSR(name, ip)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func newNodeCSR(name string, ip net.IP) ([]byte, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
		DNSNames:    []string{name},
		IPAddresses: []net.IP{ip},
	}, key)
	return der, key, err
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// tokenSecrets lists the bootstrap token Secrets in kube-system.
func (h *harness) tokenSecrets(t testing.TB) []corev1.Secret {
	t.Helper()
	list, err := h.client.CoreV1().Secrets(metav1.NamespaceSystem).List(t.Context(), metav1.ListOptions{
		FieldSelector: "type=bootstrap.kubernetes.io/token",
	})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// joinerCredentials are a joiner's attested TLS credentials, as the
// bootstrapper makes them: attest with attester, trust the join service by
// the cluster CA's discovery token CA cert hash.
func joinerCredentials(attester attestation.Attester, caHash string) (*atls.Credentials, error) {
	verify, err := clusterpki.VerifyClusterIdentity(caHash, time.Now)
	if err != nil {
		return nil, err
	}
	return atls.NewCredentials(atls.Config{Attester: attester, VerifyPeer: verify, Now: time.Now})
}

// wrappedKeys is the key service's key source for secret and salt wrapped
// by a key of a real AWS KMS API server (local-kms), as OpenKMS opens it
// from a kms://aws-kms URI file.
func wrappedKeys(t testing.TB, secret, salt []byte) interface {
	GetDataKey(ctx context.Context, id string, length int) ([]byte, error)
} {
	t.Helper()
	l := kektest.NewLocalKMS(t)
	uri, err := kek.WrapNew(t.Context(), l.URI(l.CreateKey()).String(), secret, salt, kektest.AWSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "kms-uri")
	if err := os.WriteFile(file, []byte(uri), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, closer, err := keyservice.OpenKMS(t.Context(), keyservice.KMSConfig{URIFile: file, AWSOptions: kektest.AWSOptions()},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	return keys
}
