package joinservice

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// TestGateRefusesUnprovenNodes is the attack of a node that continuous
// attestation found failing and that reboots or joins again: neither
// IssueJoinTicket nor IssueRejoinTicket looked at its taint, so `restore:
// admin` was bypassed and a tainted node got a fresh kubelet certificate or
// bootstrap token. Each refusal names its reason in the audit log, and
// nothing is issued.
func TestGateRefusesUnprovenNodes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	tpm := swtpmNode(t, policy.RoleWorker)
	h.trust(t, tpm)
	client := h.dial(t, tpm, "127.0.0.30")
	req := joinRequest(t, "worker-judged", net.IPv4(10, 0, 0, 30), false)
	if _, err := client.IssueJoinTicket(ctx, req); err != nil {
		t.Fatalf("the node's own first join: %v", err)
	}
	records := nodeattestation.NewStore(h.client, testNamespace)
	// judge writes the node's record and waits until the gate's cache has
	// it: until settled holds.
	judge := func(t *testing.T, tainted, awaitingRestore bool, settled func() bool) {
		t.Helper()
		if _, err := records.Update(ctx, "worker-judged", nil, func(old nodeattestation.Record, _ bool) (nodeattestation.Record, bool) {
			old.Attested, old.Reason, old.Message = false, "EvidenceRejected", "PCR 4 differs"
			old.Tainted, old.AwaitingRestore, old.CheckedAt = tainted, awaitingRestore, time.Now()
			return old, true
		}); err != nil {
			t.Fatal(err)
		}
		// The gate reads the records from its cache.
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return settled(), nil
		})
		if err != nil {
			t.Fatalf("the gate did not see the record: %v", err)
		}
	}
	refusedFor := func(reason string) func() bool {
		return func() bool {
			_, err := client.IssueRejoinTicket(ctx, &joinservicev1.IssueRejoinTicketRequest{DiskUuid: uuid.NewString()})
			return err != nil && strings.Contains(err.Error(), reason)
		}
	}
	rejoin := func(renew bool) error {
		r := &joinservicev1.IssueRejoinTicketRequest{DiskUuid: req.GetDiskUuid()}
		if renew {
			r.RenewKubeletCredentialsFor = "worker-judged"
		}
		_, err := client.IssueRejoinTicket(ctx, r)
		return err
	}
	setRestore := func(t *testing.T, restore string) {
		t.Helper()
		data := h.joinConfigData(t, nil)
		data[joinconfig.KeyContinuousAttestation] = "restore: " + restore + "\n"
		h.applyJoinConfig(t, data)
	}

	t.Run("restore admin: awaiting the administrator, no join, rejoin or renewal (was open)", func(t *testing.T) {
		setRestore(t, joinconfig.RestoreAdmin)
		judge(t, true, true, refusedFor("restores it first"))
		for _, tc := range []struct {
			method string
			call   func() error
		}{
			{"IssueJoinTicket", func() error { _, err := client.IssueJoinTicket(ctx, req); return err }},
			{"IssueRejoinTicket", func() error { return rejoin(false) }},
			{"IssueRejoinTicket", func() error { return rejoin(true) }},
		} {
			before := h.snapshot(t)
			h.refused(t, tc.call(), codes.PermissionDenied, tc.method, "awaiting_restore")
			h.assertNothingIssued(t, before)
		}
		if !strings.Contains(h.logs.String(), `"event":"gate.decision","kind":"rejoin","node":"worker-judged"`) {
			t.Error("no audit line of the gate's decision")
		}
	})

	t.Run("restored by the administrator, still tainted: no join or renewal (was open)", func(t *testing.T) {
		if _, err := records.Restore(ctx, "worker-judged", "admin", time.Now()); err != nil {
			t.Fatal(err)
		}
		judge(t, true, false, refusedFor("must prove itself again"))
		before := h.snapshot(t)
		_, err := client.IssueJoinTicket(ctx, req)
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "tainted")
		h.assertNothingIssued(t, before)
		// Under restore: admin, even a rejoin waits for the verdict.
		h.refused(t, rejoin(true), codes.PermissionDenied, "IssueRejoinTicket", "tainted")
		h.assertNothingIssued(t, before)
	})

	t.Run("restore automatic: a tainted node's rejoin gets its disk key, to boot and prove itself", func(t *testing.T) {
		setRestore(t, joinconfig.RestoreAuto)
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return rejoin(false) == nil, nil
		}); err != nil {
			t.Fatalf("the rejoin under restore: automatic: %v", rejoin(false))
		}
		before := h.snapshot(t)
		_, err := client.IssueJoinTicket(ctx, req)
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "tainted")
		h.assertNothingIssued(t, before)
	})

	t.Run("a taint an administrator set on the Node counts too", func(t *testing.T) {
		judge(t, false, false, func() bool { _, err := client.IssueJoinTicket(ctx, req); return err == nil })
		if _, err := client.IssueJoinTicket(ctx, req); err != nil {
			t.Fatalf("verified again: %v", err)
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-judged"},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: gate.TaintKey, Effect: corev1.TaintEffectNoExecute}}}}
		if _, err := h.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			_, err := client.IssueJoinTicket(ctx, req)
			return err != nil, nil
		})
		if err != nil {
			t.Fatal("the tainted Node's join was never refused")
		}
		before := h.snapshot(t)
		_, err = client.IssueJoinTicket(ctx, req)
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "tainted")
		h.assertNothingIssued(t, before)
	})
}
