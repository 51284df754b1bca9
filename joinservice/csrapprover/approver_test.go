package csrapprover

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/bootstraptoken"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/joinservice"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// csrPEM is a PEM certificate request of a new key for subject with the
// given names.
func csrPEM(t *testing.T, subject pkix.Name, dns []string, ips []net.IP) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject, DNSNames: dns, IPAddresses: ips}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func nodeSubject(node string) pkix.Name {
	return pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}
}

// asNode returns a client authenticated as node's kubelet (impersonated
// by the test's administrator).
func asNode(t *testing.T, cfg *rest.Config, node string) kubernetes.Interface {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node, Groups: []string{"system:nodes", "system:authenticated"}}
	client, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

var (
	clientUsages  = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	servingUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}
)

// TestApprover runs the approver against a real API server and controller
// manager (which signs what is approved) over nodes serving real TPM
// evidence. A good node's client renewal and serving certificate are
// approved and signed; every attack is denied with its reason, and
// nothing is signed for it: a compromised node's renewal, a tainted
// node's, a certificate for another node, a serving certificate naming
// another node's address or the API server, a request with a usage a
// kubelet does not have, a node that does not exist, and a user who is no
// node. kubeadm's automatic approval of renewals is removed.
func TestApprover(t *testing.T) {
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
	good := startRunningNode(t, policy.RoleWorker, clusterID, "127.0.0.1", port)
	compromised := startRunningNode(t, policy.RoleWorker, clusterID, "127.0.0.2", port)
	other := startRunningNode(t, policy.RoleWorker, clusterID, "127.0.0.3", port)

	reg := prometheus.NewRegistry()
	var logs testkit.LogBuffer
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(testWriter{T: t}, &logs), nil))
	pol, err := joinservice.NewPolicyStore(attestation.VariantTPM, time.Now, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pol.ApplyJoinConfig(joinConfig(t, []*runningNode{good, compromised, other}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := pol.ApplyDenyList(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-deny-list"},
		Data: map[string]string{joinconfig.KeyDenyList: "node:worker-denied\n"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bindings := nodebinding.New(client, namespace, time.Now)
	for node, n := range map[string]*runningNode{"worker-good": good, "worker-bad": compromised, "worker-other": other, "worker-tainted": other,
		"worker-new": good, "worker-denied": other} {
		if _, err := bindings.Bind(ctx, node, n.Identity(t)); err != nil {
			t.Fatal(err)
		}
	}
	createNode(t, client, "worker-good", "127.0.0.1", false)
	createNode(t, client, "worker-bad", "127.0.0.2", false)
	createNode(t, client, "worker-other", "127.0.0.3", false)
	createNode(t, client, "worker-tainted", "127.0.0.3", false)
	n, err := client.CoreV1().Nodes().Get(ctx, "worker-tainted", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []corev1.Taint{{Key: gate.TaintKey, Effect: corev1.TaintEffectNoExecute}}
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A compromised boot of worker-bad, after it joined.
	if err := tpm2.PCRExtend(compromised.RW, tpmutil.Handle(4), tpm2.AlgSHA256, bytes.Repeat([]byte{0xee}, 32), ""); err != nil {
		t.Fatal(err)
	}
	// kubeadm's bindings that let the controller manager approve every
	// kubelet client certificate, and the one that lets join tokens
	// request them.
	for _, b := range []struct{ name, role, group string }{
		{autoApprovalBindings[0], "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes"},
		{autoApprovalBindings[1], "system:certificates.k8s.io:certificatesigningrequests:nodeclient", joinGroup},
		{"kubeadm:kubelet-bootstrap", "system:node-bootstrapper", joinGroup},
	} {
		if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: b.group}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Bootstrap tokens: the join service's for worker-new (after its
	// evidence verified), one an administrator made, one expired.
	// Tokens that outlived their node's good standing: issued to nodes
	// that are now tainted, compromised or denied (a rejoin mints one too).
	tokens := joinservice.NewTokens(client, time.Now)
	joinToken, err := tokens.Issue(ctx, good.Identity(t)+"\x00worker-new", "127.0.0.1", "join of worker-new")
	if err != nil {
		t.Fatal(err)
	}
	staleTokens := map[string]bootstraptoken.Token{}
	for node, addr := range map[string]string{"worker-tainted": "127.0.0.3", "worker-bad": "127.0.0.2", "worker-denied": "127.0.0.3"} {
		if staleTokens[node], err = tokens.Issue(ctx, "identity\x00"+node, addr, "rejoin of "+node); err != nil {
			t.Fatal(err)
		}
	}
	adminToken, err := bootstraptoken.New("admin0", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	expiredToken, err := bootstraptoken.New("expire", time.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []bootstraptoken.Token{adminToken, expiredToken} {
		if _, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, bootstraptoken.Secret(tok, nil, "made by hand"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	asToken := func(id string) kubernetes.Interface {
		c := rest.CopyConfig(env.Config)
		c.Impersonate = rest.ImpersonationConfig{UserName: bootstrapUserPrefix + id, Groups: []string{"system:bootstrappers", joinGroup, "system:authenticated"}}
		client, err := kubernetes.NewForConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		return client
	}

	// The approver's own client: the test's polling does not take its
	// requests' rate.
	approverClient, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	verifier := continuous.NewNodeChecker(pol, bindings, atls.FetchEvidence, func(context.Context) ([]byte, error) { return clusterID, nil }, port)
	caches := startCaches(t, client)
	credentialGate, err := gate.New(pol, caches.records, caches.nodes, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	approver, err := New(Config{Client: approverClient, Checker: verifier, Gate: credentialGate, Bindings: bindings,
		Events: continuous.NewEventRecorder(ctx, client), Log: log, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- approver.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && runCtx.Err() == nil {
			t.Errorf("approver: %v", err)
		}
	})

	type request struct {
		name      string
		requester kubernetes.Interface
		signer    string
		usages    []certificatesv1.KeyUsage
		csr       []byte
		// reason is the decision's: ReasonApproved, or the denial's.
		reason string
	}
	requests := []request{
		{"good-renewal", asNode(t, env.Config, "worker-good"), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-good"), nil, nil), ReasonApproved},
		// The nodes answer on loopback addresses, which a serving
		// certificate may not name (clusterpki.ParseKubeletCSR): the
		// approved one names the node, the refused one an address that is
		// not where the node answered.
		{"good-serving", asNode(t, env.Config, "worker-good"), signerKubeletServing, servingUsages,
			csrPEM(t, nodeSubject("worker-good"), []string{"worker-good"}, nil), ReasonApproved},
		{"serving-another-address", asNode(t, env.Config, "worker-good"), signerKubeletServing, servingUsages,
			csrPEM(t, nodeSubject("worker-good"), []string{"worker-good"}, []net.IP{net.ParseIP("192.0.2.7")}), reasonNameNotOwned},
		{"serving-as-the-api-server", asNode(t, env.Config, "worker-good"), signerKubeletServing, servingUsages,
			csrPEM(t, nodeSubject("worker-good"), []string{"kubernetes.default"}, nil), reasonNameNotOwned},
		{"serving-another-node-name", asNode(t, env.Config, "worker-good"), signerKubeletServing, servingUsages,
			csrPEM(t, nodeSubject("worker-good"), []string{"worker-other"}, nil), reasonNameNotOwned},
		{"renewal-for-another-node", asNode(t, env.Config, "worker-good"), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-other"), nil, nil), reasonNotItsOwn},
		{"renewal-with-server-usage", asNode(t, env.Config, "worker-good"), signerKubeletClient,
			append(clientUsages, certificatesv1.UsageServerAuth), csrPEM(t, nodeSubject("worker-good"), nil, nil), reasonMalformed},
		{"compromised-renewal", asNode(t, env.Config, "worker-bad"), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-bad"), nil, nil), continuous.ReasonEvidenceRejected},
		{"compromised-serving", asNode(t, env.Config, "worker-bad"), signerKubeletServing, servingUsages,
			csrPEM(t, nodeSubject("worker-bad"), []string{"worker-bad"}, nil), continuous.ReasonEvidenceRejected},
		{"tainted-renewal", asNode(t, env.Config, "worker-tainted"), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-tainted"), nil, nil), gate.ReasonTainted},
		{"ghost-renewal", asNode(t, env.Config, "worker-ghost"), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-ghost"), nil, nil), reasonNoNode},
		{"user-asks-for-a-node", client, signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-good"), nil, nil), reasonNotItsOwn},
		// First client certificates, with bootstrap tokens.
		{"join-token-for-its-node", asToken(joinToken.ID), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-new"), nil, nil), ReasonApprovedJoin},
		{"join-token-for-another-node", asToken(joinToken.ID), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-good"), nil, nil), reasonNotItsOwn},
		{"admin-token", asToken(adminToken.ID), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-hand"), nil, nil), ReasonApprovedJoin},
		// The attacks on first certificates: a token still alive for a
		// node that is tainted, compromised since, or denied; an
		// administrator's token for a name an attested machine holds.
		{"token-of-a-tainted-node", asToken(staleTokens["worker-tainted"].ID), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-tainted"), nil, nil), gate.ReasonTainted},
		{"token-of-a-compromised-node", asToken(staleTokens["worker-bad"].ID), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-bad"), nil, nil), continuous.ReasonEvidenceRejected},
		{"token-of-a-denied-node", asToken(staleTokens["worker-denied"].ID), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-denied"), nil, nil), gate.ReasonDenied},
		{"admin-token-for-an-attested-name", asToken(adminToken.ID), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-good"), nil, nil), reasonNotItsOwn},
		{"expired-token", asToken(expiredToken.ID), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-late"), nil, nil), reasonTokenInvalid},
		{"unknown-token", asToken("nonexi"), signerKubeletClient, clientUsages,
			csrPEM(t, nodeSubject("worker-ghost"), nil, nil), reasonTokenInvalid},
	}
	for _, r := range requests {
		if _, err := r.requester.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: r.name},
			Spec:       certificatesv1.CertificateSigningRequestSpec{Request: r.csr, SignerName: r.signer, Usages: r.usages},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: creating the CSR: %v", r.name, err)
		}
	}
	// Wait until every request is decided, and each approved one signed.
	decided := map[string]*certificatesv1.CertificateSigningRequest{}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i, csr := range list.Items {
			approved := slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
				return c.Type == certificatesv1.CertificateApproved
			})
			if !decidable(&csr) && (!approved || len(csr.Status.Certificate) > 0) {
				decided[csr.Name] = &list.Items[i]
			}
		}
		return len(decided) == len(requests), nil
	})
	if err != nil {
		t.Fatalf("%d of %d requests decided (and signed, if approved): %v", len(decided), len(requests), err)
	}
	for _, r := range requests {
		csr := decided[r.name]
		wantType := certificatesv1.CertificateDenied
		if r.reason == ReasonApproved || r.reason == ReasonApprovedJoin {
			wantType = certificatesv1.CertificateApproved
		}
		if len(csr.Status.Conditions) != 1 || csr.Status.Conditions[0].Type != wantType || csr.Status.Conditions[0].Reason != r.reason || csr.Status.Conditions[0].Message == "" {
			t.Errorf("%s: conditions %+v, want one %s with reason %s and a message", r.name, csr.Status.Conditions, wantType, r.reason)
		}
		if wantType == certificatesv1.CertificateDenied && len(csr.Status.Certificate) > 0 {
			t.Errorf("%s: denied, yet a certificate was issued", r.name)
		}
		if !strings.Contains(logs.String(), `"event":"reattest.csr","csr":"`+r.name+`"`) {
			t.Errorf("%s: no audit line", r.name)
		}
	}
	if got := testutil.ToFloat64(approver.decisions.WithLabelValues(signerKubeletClient, continuous.ReasonEvidenceRejected)); got != 2 {
		t.Errorf("%v client renewals counted as EvidenceRejected, want 2 (a renewal and a first certificate)", got)
	}
	// A denial is a Warning Event on the Node.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=worker-bad"})
		if err != nil {
			return false, nil //nolint:nilerr // the Event may not be written yet
		}
		for _, e := range list.Items {
			if e.Reason == string(certificatesv1.CertificateDenied) && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, continuous.ReasonEvidenceRejected) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no Warning Event for the denied renewal on Node worker-bad: %v", err)
	}
	for _, name := range autoApprovalBindings {
		if _, err := client.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("kubeadm's %s is still there (%v): the controller manager would approve kubelet certificates unattested", name, err)
		}
	}
}

// TestDecidable: the approver decides pending kubelet CSRs, first client
// certificates included; never another signer's, never one decided.
func TestDecidable(t *testing.T) {
	csr := func(signer, user string, conds ...certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequest {
		c := &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: signer, Username: user}}
		for _, t := range conds {
			c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: t, Status: corev1.ConditionTrue})
		}
		return c
	}
	for _, tc := range []struct {
		name string
		csr  *certificatesv1.CertificateSigningRequest
		want bool
	}{
		{"client renewal", csr(signerKubeletClient, "system:node:a"), true},
		{"serving", csr(signerKubeletServing, "system:node:a"), true},
		{"serving from a bootstrap token", csr(signerKubeletServing, "system:bootstrap:abcdef"), true},
		{"first client certificate", csr(signerKubeletClient, "system:bootstrap:abcdef"), true},
		{"another signer", csr(certificatesv1.KubeAPIServerClientSignerName, "system:node:a"), false},
		{"approved", csr(signerKubeletClient, "system:node:a", certificatesv1.CertificateApproved), false},
		{"denied", csr(signerKubeletServing, "system:node:a", certificatesv1.CertificateDenied), false},
		{"failed", csr(signerKubeletServing, "system:node:a", certificatesv1.CertificateFailed), false},
	} {
		if got := decidable(tc.csr); got != tc.want {
			t.Errorf("%s: decidable %t, want %t", tc.name, got, tc.want)
		}
	}
}
