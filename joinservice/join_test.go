package joinservice

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	"k8s.io/utils/ptr"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

func joinRequest(t testing.TB, name string, ip net.IP, controlPlane bool) *joinservicev1.IssueJoinTicketRequest {
	t.Helper()
	csr, _ := nodeCSR(t, name, ip)
	return &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString(), CertificateRequest: csr, IsControlPlane: controlPlane}
}

// checkTicket asserts what every join ticket holds.
func (h *harness) checkTicket(t testing.TB, resp *joinservicev1.IssueJoinTicketResponse, name string) {
	t.Helper()
	if len(resp.GetStateDiskKey()) != 32 || len(resp.GetMeasurementSecret()) != 32 {
		t.Errorf("disk key %d bytes, measurement secret %d bytes; want 32 each", len(resp.GetStateDiskKey()), len(resp.GetMeasurementSecret()))
	}
	if !bytes.Equal(resp.GetMeasurementSalt(), h.salt) {
		t.Error("measurement salt differs from the join config's")
	}
	if want := strings.TrimPrefix(h.env.APIServerURL, "https://"); resp.GetApiServerEndpoint() != want {
		t.Errorf("API server endpoint %q, want %q", resp.GetApiServerEndpoint(), want)
	}
	if !bootstraputil.IsValidBootstrapToken(resp.GetToken()) {
		t.Errorf("token %q is not a bootstrap token", "<redacted>")
	}
	if left := time.Until(resp.GetTokenExpiration().AsTime()); left < tokenTTL-time.Minute || left > tokenTTL {
		t.Errorf("token expires in %s, want about %s", left, tokenTTL)
	}
	wantHash, err := kubeadm.DiscoveryTokenCACertHashPEM(h.env.CACertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetDiscoveryTokenCaCertHash() != wantHash {
		t.Errorf("CA hash %s, want %s", resp.GetDiscoveryTokenCaCertHash(), wantHash)
	}
	cert, err := x509.ParseCertificate(resp.GetKubeletCert())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(h.env.CACertPEM)
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("kubelet certificate does not verify against the cluster CA for usage %v: %v", usage, err)
		}
	}
	if life := time.Until(cert.NotAfter); life < 80*time.Minute || life > 90*time.Minute {
		t.Errorf("kubelet certificate valid until %s, want the service's kubelet certificate lifetime of 90 minutes", cert.NotAfter)
	}
	if cert.Subject.CommonName != "system:node:"+name || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("kubelet certificate subject %s", cert.Subject)
	}
	if resp.GetKubernetesVersion() != "v1.36.4" || len(resp.GetKubernetesComponents()) != 1 {
		t.Errorf("version %q with %d components", resp.GetKubernetesVersion(), len(resp.GetKubernetesComponents()))
	}
	if im := resp.GetImageMirror(); im.GetRegistry() != "mirror.example:5000" || !im.GetPlainHttp() || !slices.Equal(im.GetUpstreams(), []string{"registry.k8s.io", "docker.io"}) {
		t.Errorf("image mirror %v, want the join config's %s", im, testImageMirror)
	}
}

// checkTokenSecret asserts the bootstrap token Secret of token is kubeadm's.
func (h *harness) checkTokenSecret(t testing.TB, token string) {
	t.Helper()
	id := strings.SplitN(token, ".", 2)[0]
	s, err := h.client.CoreV1().Secrets(metav1.NamespaceSystem).Get(t.Context(), bootstraputil.BootstrapTokenSecretName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		bootstrapapi.BootstrapTokenIDKey:               id,
		bootstrapapi.BootstrapTokenUsageAuthentication: "true",
		bootstrapapi.BootstrapTokenUsageSigningKey:     "true",
		bootstrapapi.BootstrapTokenExtraGroupsKey:      "system:bootstrappers:kubeadm:default-node-token",
	}
	for k, v := range want {
		if got := string(s.Data[k]); got != v {
			t.Errorf("token Secret %s = %q, want %q", k, got, v)
		}
	}
	if s.Type != bootstrapapi.SecretTypeBootstrapToken || id+"."+string(s.Data[bootstrapapi.BootstrapTokenSecretKey]) != token {
		t.Error("token Secret does not hold the issued token")
	}
}

// waitClusterInfoSigned waits until the bootstrapsigner has signed
// cluster-info for token id.
func (h *harness) waitClusterInfoSigned(t testing.TB, id string) {
	t.Helper()
	if err := testenv.WaitClusterInfoSigned(t.Context(), h.client, id); err != nil {
		t.Fatal(err)
	}
}

// TestJoinTickets issues a worker and a control-plane ticket to attested
// nodes and checks them against the real API server, the real
// bootstrapsigner and the real `kubeadm join --dry-run` discovery.
func TestJoinTickets(t *testing.T) {
	testenv.RequireRoot(t)
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	client := h.dial(t, h.node.attester, "")

	worker := joinRequest(t, "worker-1", net.IPv4(10, 0, 0, 11), false)
	resp, err := client.IssueJoinTicket(ctx, worker)
	if err != nil {
		t.Fatal(err)
	}
	h.checkTicket(t, resp, "worker-1")
	h.checkTokenSecret(t, resp.GetToken())
	if len(resp.GetControlPlaneFiles()) != 0 || len(resp.GetEtcdEncryptionKeys()) != 0 {
		t.Error("a worker got control-plane files or the KMS v2 key-encryption key")
	}

	// A retry of the same node (a lost response) gets the same token, not a second one.
	again, err := client.IssueJoinTicket(ctx, worker)
	if err != nil {
		t.Fatal(err)
	}
	if again.GetToken() != resp.GetToken() || len(h.tokenSecrets(t)) != 1 {
		t.Errorf("a retried join created another token (%d token Secrets)", len(h.tokenSecrets(t)))
	}

	// Rejoin returns only the disk key and measurement secret, the same ones.
	rejoin, err := client.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: worker.GetDiskUuid()})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rejoin.GetStateDiskKey(), resp.GetStateDiskKey()) || !bytes.Equal(rejoin.GetMeasurementSecret(), resp.GetMeasurementSecret()) {
		t.Error("rejoin keys differ from the join keys")
	}
	if rejoin.GetKubeletBootstrapToken() != "" {
		t.Error("a rejoin that did not ask for kubelet credentials got a bootstrap token")
	}
	// Asking for kubelet credentials for its own name gives the node's
	// bootstrap token (the one it has while it lasts): one per node.
	renewal, err := client.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: worker.GetDiskUuid(), RenewKubeletCredentialsFor: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	if renewal.GetKubeletBootstrapToken() != resp.GetToken() || len(h.tokenSecrets(t)) != 1 {
		t.Errorf("kubelet credentials at rejoin: token %t, %d token Secrets; want the node's token", renewal.GetKubeletBootstrapToken() != "", len(h.tokenSecrets(t)))
	}

	// The real kubeadm discovers the cluster with the ticket's token and CA hash.
	id := strings.SplitN(resp.GetToken(), ".", 2)[0]
	h.waitClusterInfoSigned(t, id)
	out, err := testenv.RunIsolated(ctx, t.TempDir(), filepath.Join(h.env.BinDir, "kubeadm"), "join", resp.GetApiServerEndpoint(),
		"--token", resp.GetToken(),
		"--discovery-token-ca-cert-hash", resp.GetDiscoveryTokenCaCertHash(),
		"--dry-run", "--node-name", "worker-1",
		"--cri-socket", "unix:///run/containerd/containerd.sock",
		"--ignore-preflight-errors", "all", "--v", "1")
	if err != nil {
		t.Fatalf("kubeadm join --dry-run with the ticket: %v\n%s", err, out)
	}
	if want := "Cluster info signature and contents are valid and TLS certificate validates against pinned roots"; !strings.Contains(string(out), want) {
		t.Fatalf("kubeadm output lacks %q:\n%s", want, out)
	}

	t.Run("control planes join one at a time", func(t *testing.T) {
		// A control plane proves its role by what it booted: its own TPM.
		cp := swtpmNode(t, policy.RoleControlPlane)
		h.trust(t, cp)
		client := h.dial(t, cp, "")
		first := joinRequest(t, "cp-2", net.IPv4(10, 0, 0, 2), true)
		resp, err := client.IssueJoinTicket(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		h.checkTicket(t, resp, "cp-2")
		var names []string
		for _, f := range resp.GetControlPlaneFiles() {
			names = append(names, f.GetName())
			want, err := os.ReadFile(filepath.Join(h.pkiDir, f.GetName()))
			if err != nil || !bytes.Equal(want, f.GetData()) {
				t.Errorf("control-plane file %s differs from the PKI directory's", f.GetName())
			}
		}
		if !slices.Equal(names, controlPlaneFileNames) {
			t.Errorf("control-plane files %v, want %v", names, controlPlaneFileNames)
		}
		// The KMS v2 KEK, as the key service derives it.
		derive, err := kms.NewClusterKMS(h.masterKey, h.masterSalt)
		if err != nil {
			t.Fatal(err)
		}
		wantKEK, _ := derive.GetDataKey(ctx, keys.EtcdEncryptionKeyID(1), 32)
		if ks := resp.GetEtcdEncryptionKeys(); len(ks) != 1 || ks[0].GetGeneration() != 1 || !bytes.Equal(ks[0].GetKey(), wantKEK) {
			t.Errorf("KMS v2 key-encryption keys %d, want generation 1 derived from the master secret", len(ks))
		}
		lease, err := h.client.CoordinationV1().Leases(testNamespace).Get(ctx, ControlPlaneLeaseName, metav1.GetOptions{})
		if err != nil || ptr.Deref(lease.Spec.HolderIdentity, "") != "cp-2" {
			t.Fatalf("control-plane join Lease: %v, %+v", err, lease)
		}

		tokensBefore := len(h.tokenSecrets(t))
		_, err = client.IssueJoinTicket(ctx, joinRequest(t, "cp-3", net.IPv4(10, 0, 0, 3), true))
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "node cp-2 holds the control-plane join lock") {
			t.Fatalf("second concurrent control plane: %v, want Unavailable naming cp-2", err)
		}
		if retry := retryInfo(err); retry != controlPlaneBusyRetry {
			t.Errorf("the busy refusal tells to retry after %v, want %v (a google.rpc.RetryInfo detail)", retry, controlPlaneBusyRetry)
		}
		if got := len(h.tokenSecrets(t)); got != tokensBefore {
			t.Errorf("a refused control-plane join left a token: %d token Secrets, want %d", got, tokensBefore)
		}
		if _, err := client.IssueJoinTicket(ctx, first); err != nil {
			t.Fatalf("the lock holder retrying its own join: %v", err)
		}

		// Once cp-2 is a control-plane Node, its etcd member is in: cp-3 may go.
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-2", Labels: map[string]string{labelControlPlane: ""}}}
		if _, err := h.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.IssueJoinTicket(ctx, joinRequest(t, "cp-3", net.IPv4(10, 0, 0, 3), true)); err != nil {
			t.Fatalf("control plane after the previous one joined: %v", err)
		}
	})

	h.checkAudit(t, "IssueJoinTicket", "allowed", "allowed")
	h.checkAudit(t, "IssueJoinTicket", "refused", "control_plane_busy")
	h.checkAudit(t, "IssueRejoinTicket", "allowed", "allowed")
	if got := testutil.ToFloat64(h.server.metrics.tokens); got != 6 { // five joins and a rejoin's kubelet credentials
		t.Errorf("tokens_issued_total = %v, want 6", got)
	}
	h.assertNoSecretsLogged(t, resp)
}

// retryInfo returns the delay of err's google.rpc.RetryInfo detail, or 0.
func retryInfo(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.RetryInfo); ok {
			return info.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// auditEntry is the part of an audit log line the tests read.
type auditEntry struct {
	Msg      string `json:"msg"`
	Event    string `json:"event"`
	Method   string `json:"method"`
	Source   string `json:"source"`
	Verdict  string `json:"verdict"`
	Reason   string `json:"reason"`
	Node     string `json:"node"`
	TokenID  string `json:"tokenID"`
	Evidence struct {
		Variant      string `json:"variant"`
		Identity     string `json:"identity"`
		Measurements string `json:"measurements"`
		Endorsement  string `json:"endorsement"`
	} `json:"evidence"`
}

func (h *harness) auditEntries(t testing.TB) []auditEntry {
	t.Helper()
	var entries []auditEntry
	for _, line := range strings.Split(h.logs.String(), "\n") {
		var e auditEntry
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "audit" {
			entries = append(entries, e)
		}
	}
	return entries
}

// checkAudit asserts an audit entry with method, verdict and reason exists
// and is complete: source, and for requests past the handshake the
// caller's evidence.
func (h *harness) checkAudit(t testing.TB, method, verdict, reason string) {
	t.Helper()
	for _, e := range h.auditEntries(t) {
		if e.Event != "join.decision" || e.Method != method || e.Verdict != verdict || e.Reason != reason {
			continue
		}
		if e.Source == "" || (method != "handshake" && (e.Evidence.Variant != "tpm" || !strings.HasPrefix(e.Evidence.Identity, "tpm-ak:sha256:") || e.Evidence.Measurements == "")) {
			t.Errorf("audit entry incomplete: %+v", e)
		}
		if method == "IssueJoinTicket" && verdict == "allowed" && (e.Node == "" || e.TokenID == "") {
			t.Errorf("allowed join audit entry lacks node or token id: %+v", e)
		}
		return
	}
	t.Errorf("no audit entry for %s %s %s in:\n%s", method, verdict, reason, h.logs.String())
}

// assertNoSecretsLogged checks that no key, token secret or CA key reached
// the logs.
func (h *harness) assertNoSecretsLogged(t testing.TB, tickets ...*joinservicev1.IssueJoinTicketResponse) {
	t.Helper()
	secrets := [][]byte{h.masterKey}
	for _, r := range tickets {
		secrets = append(secrets, r.GetStateDiskKey(), r.GetMeasurementSecret(), []byte(r.GetToken()),
			[]byte(strings.SplitN(r.GetToken(), ".", 2)[1]))
	}
	for _, name := range []string{"ca.key", "sa.key", "etcd/ca.key", "front-proxy-ca.key"} {
		data, err := os.ReadFile(filepath.Join(h.pkiDir, name))
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, data, bytes.TrimSpace(data))
	}
	testkit.AssertNoSecrets(t, h.logs.String(), secrets)
}

// TestRefusals checks that unattested, wrongly measured, denied, malformed
// and over-budget callers are refused, that a refusal creates no token and
// fetches no key, and that the policy hot-reloads from its ConfigMaps,
// keeping the previous version when an update is bad.
func TestRefusals(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	nothingCreated := func(t *testing.T, keyRequests float64) {
		t.Helper()
		if n := len(h.tokenSecrets(t)); n != 0 {
			t.Errorf("%d token Secrets exist after a refusal", n)
		}
		if got := h.keyRequests(t); got != keyRequests {
			t.Errorf("key service answered %v requests, want %v", got, keyRequests)
		}
	}

	t.Run("unattested caller", func(t *testing.T) {
		_, err := h.dial(t, nil, "").IssueJoinTicket(ctx, joinRequest(t, "impostor", net.IPv4(10, 0, 0, 66), false))
		// The client sees the connection fail (an alert or a reset, depending
		// on timing); the server's audit entry says why.
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("unattested caller: %v, want a failed handshake", err)
		}
		nothingCreated(t, 0)
		h.waitAudit(t, "handshake", "refused", "no_evidence")
	})

	t.Run("wrongly measured caller", func(t *testing.T) {
		h.putConfigMap(t, testJoinConfig, h.joinConfigData(t, map[uint32]string{4: strings.Repeat("ff", 32)}))
		h.waitReloads(t, testJoinConfig, "applied", 2)
		_, err := h.dial(t, h.node.attester, "").IssueJoinTicket(ctx, joinRequest(t, "worker-1", net.IPv4(10, 0, 0, 11), false))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("wrongly measured caller: %v, want a failed handshake", err)
		}
		nothingCreated(t, 0)
		h.waitAudit(t, "handshake", "refused", "measurement_mismatch")
		// Back to the right reference values: the same node is admitted.
		h.putConfigMap(t, testJoinConfig, h.joinConfigData(t, nil))
		h.waitReloads(t, testJoinConfig, "applied", 3)
	})

	t.Run("bad policy update keeps the previous policy", func(t *testing.T) {
		bad := h.joinConfigData(t, nil)
		bad[joinconfig.KeyMeasurementSalt] = "00"
		h.putConfigMap(t, testJoinConfig, bad)
		h.waitReloads(t, testJoinConfig, "refused", 1)
		if !strings.Contains(h.logs.String(), "measurementSalt must be 32 bytes as hex") {
			t.Error("the refused update's error is not logged")
		}
		resp, err := h.dial(t, h.node.attester, "").IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: uuid.NewString()})
		if err != nil || len(resp.GetStateDiskKey()) != 32 {
			t.Fatalf("rejoin under the previous policy: %v", err)
		}
		nothingCreated(t, 2)
	})

	t.Run("deny list", func(t *testing.T) {
		identity := h.auditEntries(t)[len(h.auditEntries(t))-1].Evidence.Identity
		h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: "# revoked\n" + identity + "\n"})
		h.waitReloads(t, testDenyList, "applied", 1)
		client := h.dial(t, h.node.attester, "")
		_, err := client.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: uuid.NewString()})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), identity) {
			t.Fatalf("denied identity: %v, want PermissionDenied naming the entry", err)
		}
		h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: "node:worker-9\n"})
		h.waitReloads(t, testDenyList, "applied", 2)
		_, err = client.IssueJoinTicket(ctx, joinRequest(t, "worker-9", net.IPv4(10, 0, 0, 19), false))
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("denied node: %v, want PermissionDenied", err)
		}
		h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: "worker-9\n"})
		h.waitReloads(t, testDenyList, "refused", 1)
		_, err = client.IssueJoinTicket(ctx, joinRequest(t, "worker-9", net.IPv4(10, 0, 0, 19), false))
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("after a bad deny list update the previous one must stay: %v", err)
		}
		nothingCreated(t, 2)
		h.checkAudit(t, "IssueJoinTicket", "refused", "denied")
		h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: ""})
		h.waitReloads(t, testDenyList, "applied", 3)
	})

	t.Run("malformed requests", func(t *testing.T) {
		client := h.dial(t, h.node.attester, "")
		csr, _ := nodeCSR(t, "worker-1", net.IPv4(127, 0, 0, 1))
		for _, tt := range []struct {
			name    string
			req     *joinservicev1.IssueJoinTicketRequest
			wantMsg string
		}{
			{"bad disk UUID", &joinservicev1.IssueJoinTicketRequest{DiskUuid: "disk-1"}, "disk_uuid \"disk-1\" is not a UUID"},
			{"no CSR", &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString()}, "certificate request is empty"},
			{"loopback SAN", &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString(), CertificateRequest: csr}, "IP address 127.0.0.1 is loopback"},
			{"oversized", &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString(), CertificateRequest: make([]byte, maxRequestSize)}, "larger than max"},
		} {
			_, err := client.IssueJoinTicket(ctx, tt.req)
			if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("%s: %v, want %q", tt.name, err, tt.wantMsg)
			}
		}
		nothingCreated(t, 2)
	})

	t.Run("rate limit per source", func(t *testing.T) {
		h.server.limiter = connlimit.NewBuckets(connlimit.Rate{Rate: 0.001, Burst: 2}, time.Now)
		limited, other := h.dial(t, h.node.attester, "127.0.0.77"), h.dial(t, h.node.attester, "127.0.0.78")
		req := &joinservicev1.IssueRejoinTicketRequest{DiskUuid: uuid.NewString()}
		for i := range 3 {
			_, err := limited.IssueRejoinTicket(ctx, req)
			if wantLimited := i == 2; (status.Code(err) == codes.ResourceExhausted) != wantLimited {
				t.Fatalf("request %d from one source: %v (limited expected: %t)", i+1, err, wantLimited)
			}
		}
		if _, err := other.IssueRejoinTicket(ctx, req); err != nil {
			t.Fatalf("another source is limited too: %v", err)
		}
	})
	h.assertNoSecretsLogged(t)
}

// waitAudit polls for an audit entry; handshake audits are written by the
// server after the client has seen the failure.
func (h *harness) waitAudit(t testing.TB, method, verdict, reason string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return slices.ContainsFunc(h.auditEntries(t), func(e auditEntry) bool {
			return e.Method == method && e.Verdict == verdict && e.Reason == reason
		}), nil
	})
	if err != nil {
		t.Fatalf("no audit entry %s %s %s: %v\n%s", method, verdict, reason, err, h.logs.String())
	}
}
