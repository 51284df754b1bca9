package joinservice

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
)

// TestHeldNodeName: a Node that joined without Gatehouse (an
// administrator's bootstrap token, or a cluster older than Gatehouse)
// holds its name without a binding. An attested machine asking to join
// under that name would get a kubelet certificate and a bootstrap token
// that authenticate as that Node: it is refused (name_held) with nothing
// issued, until an administrator adopts the name (gatehouse node adopt,
// which calls nodebinding.Store.Adopt); then the machine's join binds it
// and the audit line records the adoption.
func TestHeldNodeName(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	machine := h.dial(t, h.node.attester, "127.0.0.40")
	id := identity(t, h.node.attester)
	for _, name := range []string{"legacy-1", "legacy-2"} {
		if _, err := h.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	store := nodebinding.New(h.client, testNamespace, time.Now)
	adopt := func(t *testing.T, node, by, identity string) {
		t.Helper()
		now := time.Now()
		if _, err := store.Adopt(ctx, node, nodebinding.Adoption{By: by, At: now, Until: now.Add(time.Hour), Identity: identity}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("an attested machine asking for a Node's name that no identity holds is refused", func(t *testing.T) {
		before := h.snapshot(t)
		resp, err := machine.IssueJoinTicket(ctx, joinRequest(t, "legacy-1", net.IPv4(10, 0, 0, 40), false))
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "name_held")
		if !strings.Contains(err.Error(), "gatehouse node adopt legacy-1") {
			t.Errorf("the refusal does not tell the administrator what to do: %v", err)
		}
		if resp.GetKubeletCert() != nil || resp.GetToken() != "" {
			t.Error("the refusal carries credentials")
		}
		h.assertNothingIssued(t, before)
	})

	t.Run("an adoption for another identity does not let the machine in", func(t *testing.T) {
		adopt(t, "legacy-2", "admin-bob", "tpm-ak:sha256:"+strings.Repeat("0", 64))
		before := h.snapshot(t)
		_, err := machine.IssueJoinTicket(ctx, joinRequest(t, "legacy-2", net.IPv4(10, 0, 0, 40), false))
		h.refused(t, err, codes.PermissionDenied, "IssueJoinTicket", "name_held")
		h.assertNothingIssued(t, before)
	})

	t.Run("once an administrator adopted the name, the machine's join binds it, audited", func(t *testing.T) {
		adopt(t, "legacy-1", "admin-alice", "")
		resp, err := machine.IssueJoinTicket(ctx, joinRequest(t, "legacy-1", net.IPv4(10, 0, 0, 40), false))
		if err != nil {
			t.Fatalf("the join after the adoption: %v", err)
		}
		h.checkTicket(t, resp, "legacy-1")
		if got, err := store.Identity(ctx, "legacy-1"); err != nil || got != id {
			t.Fatalf("legacy-1 bound to %q (%v), want the machine's %s", got, err, id)
		}
		var adopted bool
		for _, line := range strings.Split(h.logs.String(), "\n") {
			var e struct {
				Msg, Verdict, Node string
				Adoption           struct{ By string }
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "audit" && e.Verdict == "allowed" && e.Node == "legacy-1" && e.Adoption.By == "admin-alice" {
				adopted = true
			}
		}
		if !adopted {
			t.Errorf("no allowed audit line for legacy-1 with alice's adoption in:\n%s", h.logs.String())
		}
		h.assertNoSecretsLogged(t, resp)
	})
}
