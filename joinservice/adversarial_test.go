package joinservice

// The adversarial suite: what an attacker holding one legitimately attested
// worker tries against the real join service (real API server and
// controller manager, real key service over mutual TLS, the TPM simulator
// and swtpm as attesters). Every attack asserts the precise refusal and
// audit reason, that nothing was issued or left behind, and that no secret
// reached a log. Rows marked "(was open)" succeeded before issue 14
// (commit ae7bb0d): role escalation, impersonation, SAN abuse, other nodes'
// disk keys, the upper-case UUID, revocation on an open connection, the
// Lease and oversized requests going unaudited. docs/threat-model.md maps
// each to its defence.

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// issued is what a request may leave in the cluster.
type issued struct {
	tokens      int
	keys        float64
	bindings    []string
	leaseHolder string
}

func (h *harness) snapshot(t testing.TB) issued {
	t.Helper()
	s := issued{tokens: len(h.tokenSecrets(t)), keys: h.keyRequests(t)}
	list, err := h.client.CoreV1().ConfigMaps(testNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: nodebinding.Label + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range list.Items {
		s.bindings = append(s.bindings, cm.Data[nodebinding.KeyNode]+"="+cm.Data[nodebinding.KeyIdentity])
	}
	lease, err := h.client.CoordinationV1().Leases(testNamespace).Get(t.Context(), ControlPlaneLeaseName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		t.Fatal(err)
	default:
		s.leaseHolder = ptr.Deref(lease.Spec.HolderIdentity, "")
	}
	return s
}

// assertNothingIssued fails unless the cluster holds what it held in
// before: no token Secret, no key fetched, no binding, the same Lease
// holder.
func (h *harness) assertNothingIssued(t testing.TB, before issued) {
	t.Helper()
	after := h.snapshot(t)
	if after.tokens != before.tokens {
		t.Errorf("token Secrets: %d, want %d", after.tokens, before.tokens)
	}
	if after.keys != before.keys {
		t.Errorf("key service answered %v requests, want %v", after.keys, before.keys)
	}
	if strings.Join(after.bindings, ",") != strings.Join(before.bindings, ",") {
		t.Errorf("bindings %v, want %v", after.bindings, before.bindings)
	}
	if after.leaseHolder != before.leaseHolder {
		t.Errorf("control-plane Lease holder %q, want %q", after.leaseHolder, before.leaseHolder)
	}
}

// refused asserts err has code and that this refusal was audited with
// reason: a request's audit line is written before its answer, so it is the
// newest line of its method; handshakes and oversized requests are audited by gRPC hooks
// after the client saw the failure, so those are awaited.
func (h *harness) refused(t testing.TB, err error, code codes.Code, method, reason string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want %s", err, code)
	}
	if method == "handshake" || reason == "oversized_request" {
		h.waitAudit(t, method, "refused", reason)
		return
	}
	// The test sends one request at a time: the newest entry of its method is its own.
	var last *auditEntry
	for _, e := range h.auditEntries(t) {
		if e.Method == method {
			last = &e
		}
	}
	if last == nil || last.Verdict != "refused" || last.Reason != reason {
		t.Fatalf("newest %s audit entry %+v, want refused %s", method, last, reason)
	}
}

// csr builds a DER CSR from tmpl, signed by key (a fresh P-256 key when nil).
func csr(t testing.TB, tmpl *x509.CertificateRequest, key crypto.Signer) []byte {
	t.Helper()
	if key == nil {
		var err error
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// nodeSubject is a kubelet CSR subject for name.
func nodeSubject(name string) pkix.Name {
	return pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}}
}

func TestAttacks(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	// The victim: a worker on the simulator. The attacker: another worker
	// on its own swtpm. A control plane on a third TPM.
	attackerTPM, controlPlaneTPM := swtpmNode(t, policy.RoleWorker), swtpmNode(t, policy.RoleControlPlane)
	h.trust(t, attackerTPM, controlPlaneTPM)
	victim, attacker := h.dial(t, h.node.attester, "127.0.0.20"), h.dial(t, attackerTPM, "127.0.0.21")
	controlPlane := h.dial(t, controlPlaneTPM, "127.0.0.22")

	victimReq := joinRequest(t, "victim-1", net.IPv4(10, 0, 0, 20), false)
	victimTicket, err := victim.IssueJoinTicket(ctx, victimReq)
	if err != nil {
		t.Fatalf("the victim's own join: %v", err)
	}

	t.Run("worker asks for the control-plane role (was open)", func(t *testing.T) {
		before := h.snapshot(t)
		_, err := attacker.IssueJoinTicket(ctx, joinRequest(t, "attacker-cp", net.IPv4(10, 0, 0, 21), true))
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "role_not_attested")
		h.assertNothingIssued(t, before)
		// The Lease stayed free: a real control plane takes it at once.
		if _, err := controlPlane.IssueJoinTicket(ctx, joinRequest(t, "cp-1", net.IPv4(10, 0, 0, 22), true)); err != nil {
			t.Fatalf("a real control plane after the refused worker: %v", err)
		}
	})

	t.Run("control plane asks for the worker role", func(t *testing.T) {
		before := h.snapshot(t)
		_, err := controlPlane.IssueJoinTicket(ctx, joinRequest(t, "cp-as-worker", net.IPv4(10, 0, 0, 23), false))
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "role_not_attested")
		h.assertNothingIssued(t, before)
	})

	t.Run("another identity asks for a bound node name (was open)", func(t *testing.T) {
		before := h.snapshot(t)
		_, err := attacker.IssueJoinTicket(ctx, joinRequest(t, "victim-1", net.IPv4(10, 0, 0, 21), false))
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "name_bound")
		h.assertNothingIssued(t, before)
	})

	t.Run("another identity replays the victim's request (was open)", func(t *testing.T) {
		before := h.snapshot(t)
		_, err := attacker.IssueJoinTicket(ctx, victimReq)
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "name_bound")
		h.assertNothingIssued(t, before)
	})

	// Kubelet certificate names: only what the node owns (was open: any
	// SAN was copied into a serverAuth certificate under the cluster CA).
	ownIP := net.IPv4(10, 0, 0, 21)
	for _, tt := range []struct {
		name string
		node string
		dns  []string
		ips  []net.IP
	}{
		{"SAN kubernetes.default.svc impersonates the API server", "attacker-s1", []string{"attacker-s1", "kubernetes.default.svc"}, []net.IP{ownIP}},
		{"SAN kubernetes.default.svc.cluster.local impersonates the API server", "attacker-s2", []string{"kubernetes.default.svc.cluster.local"}, nil},
		{"SAN kubernetes impersonates the API server", "attacker-s3", []string{"kubernetes"}, nil},
		{"node named kubernetes", "kubernetes", []string{"kubernetes"}, nil},
		{"node named localhost", "localhost", []string{"localhost"}, nil},
		{"node named like the API service", "kubernetes.default.svc", []string{"kubernetes.default.svc"}, nil},
		{"SAN of another node's name", "attacker-s4", []string{"attacker-s4", "victim-1"}, []net.IP{ownIP}},
		{"SAN under a DNS suffix nobody configured", "attacker-s5", []string{"attacker-s5.example.com"}, nil},
		{"IP address outside the node CIDRs", "attacker-s6", []string{"attacker-s6"}, []net.IP{net.IPv4(192, 0, 2, 7)}},
		{"IP address of another network's host", "attacker-s7", []string{"attacker-s7"}, []net.IP{net.IPv4(172, 16, 0, 1)}},
	} {
		t.Run(tt.name+" (was open)", func(t *testing.T) {
			before := h.snapshot(t)
			der := csr(t, &x509.CertificateRequest{Subject: nodeSubject(tt.node), DNSNames: tt.dns, IPAddresses: tt.ips}, nil)
			_, err := attacker.IssueJoinTicket(ctx, &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString(), CertificateRequest: der})
			h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "name_not_owned")
			h.assertNothingIssued(t, before)
		})
	}

	// CSR abuse: malformed or over-privileged requests.
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	badSig := csr(t, &x509.CertificateRequest{Subject: nodeSubject("attacker-c6"), DNSNames: []string{"attacker-c6"}}, nil)
	badSig[len(badSig)-3] ^= 0xff
	for _, tt := range []struct {
		name string
		der  []byte
	}{
		{"CSR in group system:masters", csr(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:attacker-c1", Organization: []string{"system:nodes", "system:masters"}}, DNSNames: []string{"attacker-c1"}}, nil)},
		{"CSR for a user, not a node", csr(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:nodes"}}, DNSNames: []string{"admin"}}, nil)},
		{"CSR with an organizational unit", csr(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:attacker-c2", Organization: []string{"system:nodes"}, OrganizationalUnit: []string{"x"}}, DNSNames: []string{"attacker-c2"}}, nil)},
		{"CSR with a URI SAN posing as the join service", csr(t, &x509.CertificateRequest{Subject: nodeSubject("attacker-c3"), DNSNames: []string{"attacker-c3"}, URIs: []*url.URL{{Scheme: "urn", Opaque: "gatehouse:joinservice"}}}, nil)},
		{"CSR with an e-mail SAN", csr(t, &x509.CertificateRequest{Subject: nodeSubject("attacker-c4"), DNSNames: []string{"attacker-c4"}, EmailAddresses: []string{"root@example.com"}}, nil)},
		{"CSR with an RSA-1024 key", csr(t, &x509.CertificateRequest{Subject: nodeSubject("attacker-c5"), DNSNames: []string{"attacker-c5"}}, rsa1024)},
		{"CSR with a broken signature", badSig},
		{"CSR without names", csr(t, &x509.CertificateRequest{Subject: nodeSubject("attacker-c7")}, nil)},
		{"CSR that is not DER", []byte("-----BEGIN CERTIFICATE REQUEST-----")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := h.snapshot(t)
			_, err := attacker.IssueJoinTicket(ctx, &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString(), CertificateRequest: tt.der})
			h.refused(t, err, codes.InvalidArgument, "IssueJoinTicket", "invalid_request")
			h.assertNothingIssued(t, before)
		})
	}

	t.Run("request with fields the service does not know", func(t *testing.T) {
		before := h.snapshot(t)
		raw, err := proto.Marshal(joinRequest(t, "attacker-u", ownIP, false))
		if err != nil {
			t.Fatal(err)
		}
		raw = protowire.AppendVarint(protowire.AppendTag(raw, 77, protowire.VarintType), 1)
		req := &joinservicev1.IssueJoinTicketRequest{}
		if err := proto.Unmarshal(raw, req); err != nil {
			t.Fatal(err)
		}
		_, err = attacker.IssueJoinTicket(ctx, req)
		h.refused(t, err, codes.InvalidArgument, "IssueJoinTicket", "invalid_request")
		h.assertNothingIssued(t, before)
	})

	// Disk keys: any UUID yields the caller's own key.
	t.Run("another identity asks the key of the victim's disk at join (was open)", func(t *testing.T) {
		resp, err := attacker.IssueJoinTicket(ctx, &joinservicev1.IssueJoinTicketRequest{
			DiskUuid: victimReq.GetDiskUuid(), CertificateRequest: csr(t, &x509.CertificateRequest{Subject: nodeSubject("attacker-d1"), DNSNames: []string{"attacker-d1"}, IPAddresses: []net.IP{ownIP}}, nil),
		})
		if err != nil {
			t.Fatalf("the attacker's own join: %v", err) // allowed: it gets its own key for the UUID
		}
		if bytes.Equal(resp.GetStateDiskKey(), victimTicket.GetStateDiskKey()) {
			t.Fatal("the attacker got the victim's disk key")
		}
	})
	t.Run("another identity asks the key of the victim's disk at rejoin (was open)", func(t *testing.T) {
		resp, err := attacker.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: victimReq.GetDiskUuid()})
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(resp.GetStateDiskKey(), victimTicket.GetStateDiskKey()) {
			t.Fatal("the attacker got the victim's disk key")
		}
	})
	// Kubelet credentials at rejoin are for the caller's own node name only.
	for _, tc := range []struct{ name, node, code, reason string }{
		{"another machine's node name", "victim-1", "PermissionDenied", "name_bound"},
		{"a node name nobody holds", "nobody-1", "PermissionDenied", "name_bound"},
		{"a malformed node name", "Victim_1", "InvalidArgument", "invalid_request"},
	} {
		t.Run("kubelet credentials at rejoin for "+tc.name+" are refused", func(t *testing.T) {
			before := h.snapshot(t)
			_, err := attacker.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: victimReq.GetDiskUuid(), RenewKubeletCredentialsFor: tc.node})
			code := codes.PermissionDenied
			if tc.code == "InvalidArgument" {
				code = codes.InvalidArgument
			}
			h.refused(t, err, code, "IssueRejoinTicket", tc.reason)
			h.assertNothingIssued(t, before)
		})
	}
	t.Run("upper-case UUID gives the same key, not a second one (was open)", func(t *testing.T) {
		resp, err := victim.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: strings.ToUpper(victimReq.GetDiskUuid())})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(resp.GetStateDiskKey(), victimTicket.GetStateDiskKey()) {
			t.Fatal("the upper-case UUID gave another key")
		}
	})
	for _, bad := range []string{"00000000-0000-0000-0000-000000000000", "disk-1", strings.Repeat("a", 36)} {
		t.Run("disk UUID "+bad+" is refused", func(t *testing.T) {
			before := h.snapshot(t)
			_, err := attacker.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: bad})
			h.refused(t, err, codes.InvalidArgument, "IssueRejoinTicket", "invalid_request")
			h.assertNothingIssued(t, before)
		})
	}

	// Revocation on an open connection.
	rejoin := func(c joinservicev1.JoinServiceClient) error {
		_, err := c.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: uuid.NewString()})
		return err
	}
	t.Run("open connection after the reference values changed (was open)", func(t *testing.T) {
		if err := rejoin(attacker); err != nil {
			t.Fatal(err)
		}
		h.applyJoinConfig(t, h.joinConfigData(t, map[uint32]string{4: strings.Repeat("ee", 32)}))
		before := h.snapshot(t)
		h.refused(t, rejoin(attacker), codes.PermissionDenied, "IssueRejoinTicket", "measurement_mismatch")
		h.assertNothingIssued(t, before)
		h.applyJoinConfig(t, h.joinConfigData(t, nil))
	})
	t.Run("open connection after its key was unpinned (was open)", func(t *testing.T) {
		if err := rejoin(attacker); err != nil {
			t.Fatal(err)
		}
		trusted := h.extraAKs
		h.extraAKs = []crypto.PublicKey{controlPlaneTPM.AttestationKey()}
		h.applyJoinConfig(t, h.joinConfigData(t, nil))
		before := h.snapshot(t)
		h.refused(t, rejoin(attacker), codes.PermissionDenied, "IssueRejoinTicket", "untrusted_key")
		h.assertNothingIssued(t, before)
		h.extraAKs = trusted
		h.applyJoinConfig(t, h.joinConfigData(t, nil))
	})
	t.Run("open connection after its identity was denied", func(t *testing.T) {
		if err := rejoin(attacker); err != nil {
			t.Fatal(err)
		}
		h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: identity(t, attackerTPM) + "\n"})
		h.waitReloads(t, testDenyList, "applied", 1)
		before := h.snapshot(t)
		h.refused(t, rejoin(attacker), codes.PermissionDenied, "IssueRejoinTicket", "denied")
		h.assertNothingIssued(t, before)
		h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: ""})
		h.waitReloads(t, testDenyList, "applied", 2)
	})
	t.Run("denied node name", func(t *testing.T) {
		h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: "node:attacker-n\n"})
		h.waitReloads(t, testDenyList, "applied", 3)
		before := h.snapshot(t)
		_, err := attacker.IssueJoinTicket(ctx, joinRequest(t, "attacker-n", ownIP, false))
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "denied")
		h.assertNothingIssued(t, before)
		h.putConfigMap(t, testDenyList, map[string]string{joinconfig.KeyDenyList: ""})
		h.waitReloads(t, testDenyList, "applied", 4)
	})

	// Rebinding a name takes an administrator, naming the exact identity.
	annotate := func(t *testing.T, identity string) {
		t.Helper()
		cms := h.client.CoreV1().ConfigMaps(testNamespace)
		cm, err := cms.Get(ctx, nodebinding.Name("victim-1"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Annotations = map[string]string{nodebinding.AnnotationAllowIdentity: identity}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("rebinding allowed for another identity does not help the attacker", func(t *testing.T) {
		annotate(t, identity(t, controlPlaneTPM))
		before := h.snapshot(t)
		_, err := attacker.IssueJoinTicket(ctx, joinRequest(t, "victim-1", ownIP, false))
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "name_bound")
		h.assertNothingIssued(t, before)
	})
	t.Run("an administrator rebinds a reinstalled machine's name once, audited", func(t *testing.T) {
		annotate(t, identity(t, attackerTPM))
		if _, err := attacker.IssueJoinTicket(ctx, joinRequest(t, "victim-1", ownIP, false)); err != nil {
			t.Fatalf("the allowed identity: %v", err)
		}
		if !strings.Contains(h.logs.String(), `"rebound":true`) || !strings.Contains(h.logs.String(), `"previousIdentity":"`+identity(t, h.node.attester)) {
			t.Error("the rebinding is not audited with both identities")
		}
		before := h.snapshot(t)
		_, err := victim.IssueJoinTicket(ctx, victimReq)
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "name_bound")
		h.assertNothingIssued(t, before)
	})

	t.Run("second control plane while the first holds the Lease", func(t *testing.T) {
		second := h.dial(t, swtpmNodeTrusted(t, h), "127.0.0.23")
		before := h.snapshot(t)
		if before.leaseHolder != "cp-1" {
			t.Fatalf("Lease holder %q, want cp-1", before.leaseHolder)
		}
		_, err := second.IssueJoinTicket(ctx, joinRequest(t, "cp-2", net.IPv4(10, 0, 0, 24), true))
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "node cp-1 holds the control-plane join lock") {
			t.Fatalf("second control plane: %v, want Unavailable naming cp-1", err)
		}
		h.waitAudit(t, "IssueJoinTicket", "refused", "control_plane_busy")
		if after := h.snapshot(t); after.tokens != before.tokens || after.leaseHolder != "cp-1" {
			t.Errorf("after the busy refusal: %+v, want no token and cp-1 holding", after)
		}
		// Nor can it take the holder's name to resume the holder's Lease.
		before = h.snapshot(t)
		_, err = second.IssueJoinTicket(ctx, joinRequest(t, "cp-1", net.IPv4(10, 0, 0, 24), true))
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "name_bound")
		h.assertNothingIssued(t, before)
	})

	t.Run("oversized request is refused, audited and counted (was open)", func(t *testing.T) {
		before := h.snapshot(t)
		_, err := attacker.IssueJoinTicket(ctx, &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString(), CertificateRequest: make([]byte, maxRequestSize)})
		h.refused(t, err, codes.ResourceExhausted, "IssueJoinTicket", "oversized_request")
		if got := testutil.ToFloat64(h.server.metrics.verdicts.WithLabelValues("IssueJoinTicket", "refused", "oversized_request")); got != 1 {
			t.Errorf("oversized_request verdicts = %v, want 1", got)
		}
		h.assertNothingIssued(t, before)
	})

	t.Run("unattested caller", func(t *testing.T) {
		before := h.snapshot(t)
		_, err := h.dial(t, nil, "127.0.0.25").IssueJoinTicket(ctx, joinRequest(t, "impostor", ownIP, false))
		h.refused(t, err, codes.Unavailable, "handshake", "no_evidence")
		h.assertNothingIssued(t, before)
	})

	t.Run("request flood from one source", func(t *testing.T) {
		h.server.limiter = connlimit.NewBuckets(connlimit.Rate{Rate: 0.001, Burst: 1}, h.server.cfg.Now)
		flood := h.dial(t, attackerTPM, "127.0.0.26")
		if err := rejoin(flood); err != nil {
			t.Fatal(err)
		}
		before := h.snapshot(t)
		h.refused(t, rejoin(flood), codes.ResourceExhausted, "IssueRejoinTicket", "rate_limited")
		h.assertNothingIssued(t, before)
	})

	h.assertNoSecretsLogged(t, victimTicket)
}

// swtpmNodeTrusted boots another control plane on its own TPM and trusts it.
func swtpmNodeTrusted(t *testing.T, h *harness) *tpmattester.QuoteAttester {
	t.Helper()
	a := swtpmNode(t, policy.RoleControlPlane)
	h.trust(t, a)
	return a
}
