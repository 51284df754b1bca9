package csrapprover

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	tdxverify "github.com/google/go-tdx-guest/verify"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/cvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snpguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxguest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// deniedMachine is a running node whose evidence proves the identity one
// deny-list entry names.
type deniedMachine struct {
	// kind names the identity, for the subtest.
	kind string
	// attester is the machine's, serving at ip; vtpm is its (v)TPM's,
	// whose AK identity its node name is bound to.
	attester attestation.Attester
	vtpm     *tpmattester.QuoteAttester
	ip       string
	// variant and trust are the join policy's variant and its key trust
	// (or hardware) section.
	variant attestation.Variant
	trust   map[string]any
	// entry is the deny-list entry, computed from the machine's own
	// certificates and hardware, not from what the verifier makes of them.
	entry string
}

// TestDenyListEveryIdentity: for each identity verified evidence proves
// (the attestation key, the EK certificate, the Compute Engine instance,
// the SEV-SNP chip, also when the host masks CHIP_ID, the TDX platform)
// and for the node name, a running node whose evidence verifies is
// Verified, and its kubelet client renewal approved and signed, until the
// deny list names that identity; then the
// re-verification gives Denied naming the entry, and a renewal of its
// kubelet client certificate through the approver is denied with reason
// Denied and nothing is signed. Before issue 32 only the attestation key
// and the node name were matched: a machine on a denied chip, platform,
// EK or instance stayed Verified and renewed its certificates.
func TestDenyListEveryIdentity(t *testing.T) {
	testenv.RequireRoot(t) // swtpm_setup manufactures EK certificates as root
	env := testenv.New(t, testenv.Options{ControllerManager: true, Controllers: []string{"csrsigning"}})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	clusterID := make([]byte, 32)
	if _, err := rand.Read(clusterID); err != nil {
		t.Fatal(err)
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	_ = probe.Close()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bindings := nodebinding.New(client, namespace, time.Now)
	var logs testkit.LogBuffer
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(testWriter{T: t}, &logs), nil))

	for i, m := range deniedMachines(t, clusterID) {
		t.Run(m.kind, func(t *testing.T) {
			node := fmt.Sprintf("worker-denied-%d", i)
			if m.kind == "node name" {
				m.entry = "node:" + node
			}
			serveEvidence(t, m.attester, m.ip, port)
			identity, err := m.vtpm.Identity()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := bindings.Bind(ctx, node, identity); err != nil {
				t.Fatal(err)
			}
			denyCreateNode(t, client, node, m.ip)
			pol, err := joinservice.NewPolicyStore(m.variant, time.Now, log, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			if err := pol.ApplyJoinConfig(denyJoinConfig(t, m.variant, m.trust)); err != nil {
				t.Fatal(err)
			}
			applyDeny := func(text string) {
				t.Helper()
				if err := pol.ApplyDenyList(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-deny-list"},
					Data: map[string]string{joinconfig.KeyDenyList: text}}); err != nil {
					t.Fatal(err)
				}
			}
			verifier := continuous.NewNodeChecker(pol, bindings, atls.FetchEvidence, func(context.Context) ([]byte, error) { return clusterID, nil }, port)
			c := startCaches(t, client)
			credentialGate, err := gate.New(pol, c.records, c.nodes, log, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}

			// Not denied yet: the evidence verifies, from the machine
			// bound to the name.
			applyDeny("")
			if o, err := verifier.Check(ctx, n); err != nil || o.Reason != continuous.ReasonVerified {
				t.Fatalf("before the deny list names it: %+v, %v; want %s", o, err, continuous.ReasonVerified)
			}
			if csr := denyRenew(t, env.Config, client, verifier, credentialGate, log, node, "before"); len(csr.Status.Certificate) == 0 {
				t.Fatalf("before the deny list names it, the renewal was not signed: %+v", csr.Status.Conditions)
			}

			applyDeny("# " + m.kind + "\n" + m.entry + "\n")
			o, err := verifier.Check(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			if o.Attested || o.Reason != continuous.ReasonDenied || !strings.Contains(o.Message, strconv.Quote(m.entry)) {
				t.Fatalf("denied by %s: outcome %+v, want %s naming the entry", m.entry, o, continuous.ReasonDenied)
			}

			csr := denyRenew(t, env.Config, client, verifier, credentialGate, log, node, "denied")
			if len(csr.Status.Conditions) != 1 || csr.Status.Conditions[0].Type != certificatesv1.CertificateDenied ||
				csr.Status.Conditions[0].Reason != continuous.ReasonDenied || !strings.Contains(csr.Status.Conditions[0].Message, m.entry) {
				t.Fatalf("the denied machine's renewal: conditions %+v, want Denied with reason %s naming the entry", csr.Status.Conditions, continuous.ReasonDenied)
			}
			if len(csr.Status.Certificate) > 0 {
				t.Fatal("the denied machine's renewal was signed")
			}
			// The worker writes the audit line after the decision it
			// recorded on the CSR: wait for it.
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				return strings.Contains(logs.String(), `"event":"reattest.csr","csr":"`+csr.Name+`"`), nil
			}); err != nil {
				t.Errorf("no audit line for the denied renewal %s", csr.Name)
			}
		})
	}
}

// deniedMachines returns a running machine for each kind of identity,
// its node lock taken with clusterID, on loopback addresses 127.0.7.x.
func deniedMachines(t *testing.T, clusterID []byte) []deniedMachine {
	t.Helper()
	var ms []deniedMachine

	ak := tpmattester.Options{PCRs: testPCRs}
	plain := lockedAttester(t, clusterID, ak, nil)
	ms = append(ms, deniedMachine{kind: "attestation key", attester: plain, vtpm: plain, ip: "127.0.7.1",
		variant: attestation.VariantTPM, trust: map[string]any{"pinnedAKs": []string{akPEM(t, plain)}}, entry: mustIdentity(t, plain)})
	named := lockedAttester(t, clusterID, ak, nil)
	ms = append(ms, deniedMachine{kind: "node name", attester: named, vtpm: named, ip: "127.0.7.2",
		variant: attestation.VariantTPM, trust: map[string]any{"pinnedAKs": []string{akPEM(t, named)}}})

	ca := swtpmtest.CA(t)
	manufactured := swtpmtest.Manufacture(t, ca, testPCRs, func(sw *swtpm.TPM) error {
		rw, err := sw.Open()
		if err != nil {
			return err
		}
		defer rw.Close()
		return bootLocked(rw, clusterID)
	}).Attester
	ekCert, err := x509.ParseCertificate(manufactured.EKCertificate())
	if err != nil {
		t.Fatal(err)
	}
	issuer := sha256.Sum256(ekCert.RawIssuer)
	root, inter, err := ca.Roots()
	if err != nil {
		t.Fatal(err)
	}
	ms = append(ms, deniedMachine{kind: "EK certificate", attester: manufactured, vtpm: manufactured, ip: "127.0.7.3",
		variant: attestation.VariantTPM, trust: map[string]any{"ekRoots": string(root), "ekIntermediates": string(inter)},
		entry: "tpm-ek:" + hex.EncodeToString(issuer[:]) + ":" + ekCert.SerialNumber.Text(16)})

	google := testkit.NewCA(t, "test vTPM CA standing in for Google's")
	gce := lockedAttester(t, clusterID, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKGCE}, func(rw io.ReadWriter) {
		swtpmtest.ProvisionGCE(t, rw, google, swtpmtest.GCEInstance{Zone: "europe-west3-a", ProjectID: "my-project", ProjectNumber: 42, ID: 4567890123456789012, Name: "node-7"})
	})
	ms = append(ms, deniedMachine{kind: "Compute Engine instance", attester: gce, vtpm: gce, ip: "127.0.7.4",
		variant: attestation.VariantTPM, trust: map[string]any{"gce": map[string]any{"projects": []string{"my-project"}, "roots": string(google.PEM)}},
		entry: "gce-instance:my-project/europe-west3-a/4567890123456789012"})

	launch := bytes.Repeat([]byte{0xaa}, 48)
	tcb := kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}
	amd := snptest.NewAMD(t, snptest.Options{TCB: tcb, ChipID: bytes.Repeat([]byte{0x5a}, 64)})
	snpTrust := map[string]any{"sevSnp": map[string]any{
		"launchMeasurements": []string{hex.EncodeToString(launch)},
		"minimumTCB":         map[string]any{"bootloader": 3, "snp": 8, "microcode": 115},
		"roots":              []string{amd.CertChainPEM()},
	}}
	for i, mask := range []bool{false, true} {
		vtpm := lockedAttester(t, clusterID, ak, nil)
		hw, err := snpguest.NewWithProvider(amd.Device(t, snptest.Report{Measurement: launch, MaskChipID: mask}))
		if err != nil {
			t.Fatal(err)
		}
		kind := "SEV-SNP chip"
		if mask {
			// The host masks CHIP_ID to dodge the entry; the VCEK that
			// signs the report still names the chip.
			kind += ", CHIP_ID masked by the host"
		}
		ms = append(ms, deniedMachine{kind: kind, attester: confidentialVM(t, hw, vtpm), vtpm: vtpm, ip: fmt.Sprintf("127.0.7.%d", 5+i),
			variant: attestation.VariantSNP, trust: snpTrust, entry: "sev-snp-chip:" + hex.EncodeToString(amd.ChipID)})
	}

	intel := tdxtest.NewIntel(t)
	tdxVTPM := lockedAttester(t, clusterID, ak, nil)
	hw, err := tdxguest.NewWithProvider(intel.Device(t, func(b *pb.TDQuoteBody) { b.MrTd = launch }))
	if err != nil {
		t.Fatal(err)
	}
	ms = append(ms, deniedMachine{kind: "TDX platform", attester: confidentialVM(t, hw, tdxVTPM), vtpm: tdxVTPM, ip: "127.0.7.7",
		variant: attestation.VariantTDX, trust: map[string]any{"tdx": map[string]any{"mrtd": hex.EncodeToString(launch), "roots": intel.RootPEM()}},
		entry: "tdx-ppid:" + samplePPID(t)})
	return ms
}

// bootLocked measures a worker's boot into rw and takes the node lock
// with clusterID.
func bootLocked(rw io.ReadWriter, clusterID []byte) error {
	if _, err := tpmattester.MeasureBoot(rw, bootArtefacts(policy.RoleWorker)); err != nil {
		return err
	}
	return tpm2.PCRExtend(rw, tpmutil.Handle(keys.NodeLockPCR), tpm2.AlgSHA256, clusterID, "")
}

// lockedAttester is a worker on its own swtpm that took its node lock,
// provisioned by provision (when set) before its attester is made.
func lockedAttester(t *testing.T, clusterID []byte, opts tpmattester.Options, provision func(io.ReadWriter)) *tpmattester.QuoteAttester {
	t.Helper()
	rw := swtpmtest.Boot(t, t.TempDir(), nil)
	if err := bootLocked(rw, clusterID); err != nil {
		t.Fatal(err)
	}
	if provision != nil {
		provision(rw)
	}
	a, err := tpmattester.New(rw, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func confidentialVM(t *testing.T, hardware, vtpm attestation.Attester) attestation.Attester {
	t.Helper()
	a, err := cvm.NewCompositeAttester(hardware, vtpm)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// samplePPID is the PPID of the PCK certificate tdxtest's quotes carry
// (the SGX extension of go-tdx-guest's sample quote).
func samplePPID(t *testing.T) string {
	t.Helper()
	chain, err := tdxverify.ExtractChainFromQuote(tdxtest.SampleQuote(t))
	if err != nil {
		t.Fatal(err)
	}
	ext, err := pcs.PckCertificateExtensions(chain.PCKCertificate)
	if err != nil {
		t.Fatal(err)
	}
	return ext.PPID
}

func mustIdentity(t *testing.T, a *tpmattester.QuoteAttester) string {
	t.Helper()
	id, err := a.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func akPEM(t *testing.T, a *tpmattester.QuoteAttester) string {
	t.Helper()
	spki, err := x509.MarshalPKIXPublicKey(a.AttestationKey())
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}))
}

// serveEvidence serves a's evidence at ip:port until the test ends, as
// gatehouse-bootstrapper serve-evidence does.
func serveEvidence(t *testing.T, a attestation.Attester, ip string, port int) {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = atls.ServeEvidence(t.Context(), lis, a) }()
}

// denyJoinConfig is a join config of variant expecting what the test
// workers boot, its key trust (or hardware) section trust.
func denyJoinConfig(t *testing.T, variant attestation.Variant, trust map[string]any) *corev1.ConfigMap {
	t.Helper()
	ref := func(role policy.Role, pcrs ...int) map[string]any {
		r, err := tpm.ReferenceValues(bootArtefacts(role), pcrs)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]any{}
		for i, m := range r {
			out[strconv.Itoa(int(i))] = map[string]any{"expected": hex.EncodeToString(m.Expected)}
		}
		return out
	}
	doc := map[string]any{
		"variant": string(variant), "pcrs": testPCRs, "referenceValues": ref(policy.RoleWorker, 4),
		"roles": map[policy.Role]any{
			policy.RoleControlPlane: map[string]any{"referenceValues": ref(policy.RoleControlPlane, rolePCR)},
			policy.RoleWorker:       map[string]any{"referenceValues": ref(policy.RoleWorker, rolePCR)},
		},
	}
	for k, v := range trust {
		doc[k] = v
	}
	attestationYAML, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	components, err := json.Marshal([]map[string]any{{
		"url": "https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", "hash": "sha256:" + strings.Repeat("ab", 32),
		"installPath": "/usr/local/bin/kubelet",
	}})
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-join-config", Namespace: namespace}, Data: map[string]string{
		joinconfig.KeyAttestation: string(attestationYAML), joinconfig.KeyMeasurementSalt: strings.Repeat("cd", keys.MeasurementSaltSize),
		joinconfig.KeyAPIServerEndpoint: "10.0.0.1:6443", joinconfig.KeyKubernetesVersion: "v1.36.4",
		joinconfig.KeyKubernetesComponents: string(components),
	}}
}

// denyCreateNode creates worker Node name with InternalIP ip.
func denyCreateNode(t *testing.T, client kubernetes.Interface, name, ip string) {
	t.Helper()
	created, err := client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(t.Context(), created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// denyRenew has node's kubelet ask for a new client certificate (request
// node-renewal-suffix), runs an approver with verifier until the request
// is decided (and signed, if approved), and returns the request.
func denyRenew(t *testing.T, cfg *rest.Config, client kubernetes.Interface, verifier *continuous.NodeChecker, g *gate.Gate, log *slog.Logger, node, suffix string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	asNode := rest.CopyConfig(cfg)
	asNode.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node, Groups: []string{"system:nodes", "system:authenticated"}}
	kubelet, err := kubernetes.NewForConfig(asNode)
	if err != nil {
		t.Fatal(err)
	}
	name := node + "-renewal-" + suffix
	if _, err := kubelet.CertificatesV1().CertificateSigningRequests().Create(t.Context(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), SignerName: signerKubeletClient,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	approver, err := New(Config{Client: client, Checker: verifier, Gate: g, Bindings: nodebinding.New(client, namespace, time.Now),
		Events: continuous.NewEventRecorder(t.Context(), client), Log: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- approver.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("approver: %v", err)
		}
	}()
	var csr *certificatesv1.CertificateSigningRequest
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		csr, err = client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		approved := slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
			return c.Type == certificatesv1.CertificateApproved
		})
		return !decidable(csr) && (!approved || len(csr.Status.Certificate) > 0), nil
	})
	if err != nil {
		t.Fatalf("the renewal of %s was not decided: %v", node, err)
	}
	return csr
}
