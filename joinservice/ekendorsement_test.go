package joinservice

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// trustManufacturer replaces the pinned AKs of the join policy with ca's
// root and intermediate (and extraRoots, PEM), and waits until the service
// applied it.
func (h *harness) trustManufacturer(t testing.TB, ca swtpm.LocalCA, extraRoots ...[]byte) {
	t.Helper()
	root, inter, err := ca.Roots()
	if err != nil {
		t.Fatal(err)
	}
	h.ekRoots, h.ekIntermediates = string(bytes.Join(append([][]byte{root}, extraRoots...), nil)), string(inter)
	h.applyJoinConfig(t, h.joinConfigData(t, nil))
}

// manufacturedNode is a node of role on a TPM that ca manufactured, booted
// as role, sending its EK certificate.
func manufacturedNode(t testing.TB, ca swtpm.LocalCA, role policy.Role) *tpmattester.QuoteAttester {
	t.Helper()
	return swtpmtest.Manufacture(t, ca, testPCRs, func(sw *swtpm.TPM) error {
		rw, err := sw.Open()
		if err != nil {
			return err
		}
		defer rw.Close()
		_, err = tpmattester.MeasureBoot(rw, bootArtefacts(role))
		return err
	}).Attester
}

// TestEKEndorsedJoin: with a policy naming a TPM manufacturer's CA and no
// pinned key, a node whose TPM that manufacturer made joins; a TPM of
// another manufacturer, an AK not resident with the EK it presents, a
// replayed activation answer and a TPM without an EK certificate are
// refused in the handshake, with their reasons, and nothing is issued.
func TestEKEndorsedJoin(t *testing.T) {
	testenv.RequireRoot(t)
	h := newHarness(t, harnessOptions{})
	ca, other := swtpmtest.CA(t), swtpmtest.CA(t)
	// A second trusted manufacturer, whose certificates for a genuine EK
	// are expired or lack the EK usage.
	testCA := testkit.NewCA(t, "test TPM manufacturer")
	h.trustManufacturer(t, ca, testCA.PEM)
	ctx := t.Context()

	worker := manufacturedNode(t, ca, policy.RoleWorker)
	// The recorder keeps the answer of this join's activation, for the
	// replay below.
	recorder := &swtpmtest.Replaying{QuoteAttester: worker}
	resp, err := h.dial(t, recorder, "").IssueJoinTicket(ctx, joinRequest(t, "worker-ek", net.IPv4(10, 0, 0, 21), false))
	if err != nil {
		t.Fatalf("a node of the configured manufacturer, with no registered key: %v", err)
	}
	h.checkTicket(t, resp, "worker-ek")
	h.checkAudit(t, "IssueJoinTicket", "allowed", "allowed")
	if !slices.ContainsFunc(h.auditEntries(t), func(e auditEntry) bool {
		return e.Node == "worker-ek" && strings.HasPrefix(e.Evidence.Endorsement, "ek-certificate manufacturer=id:00001014")
	}) {
		t.Errorf("the allowed join's audit entry does not name the EK certificate:\n%s", h.logs.String())
	}

	stranger := manufacturedNode(t, ca, policy.RoleWorker)
	for _, tt := range []struct {
		name     string
		attester attestation.Attester
		reason   string
	}{
		{"TPM of another manufacturer", manufacturedNode(t, other, policy.RoleWorker), "untrusted_key"},
		{"AK not resident with the EK", swtpmtest.SwappedEK{QuoteAttester: stranger, EKCertificate: worker.EKCertificate()}, "activation_failed"},
		{"replayed activation answer", recorder, "activation_failed"},
		{"TPM without an EK certificate", h.node.attester, "untrusted_key"},
		{"expired EK certificate", swtpmtest.SwappedEK{QuoteAttester: worker, EKCertificate: swtpmtest.ReissueEK(t, worker.EKCertificate(), testCA,
			time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour), true)}, "untrusted_key"},
		{"not an EK certificate", swtpmtest.SwappedEK{QuoteAttester: worker, EKCertificate: swtpmtest.ReissueEK(t, worker.EKCertificate(), testCA,
			time.Now().Add(-time.Hour), time.Now().Add(time.Hour), false)}, "untrusted_key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := h.snapshot(t)
			_, err := h.dial(t, tt.attester, "").IssueJoinTicket(ctx, joinRequest(t, "intruder", net.IPv4(10, 0, 0, 22), false))
			h.refused(t, err, codes.Unavailable, "handshake", tt.reason)
			h.assertNothingIssued(t, before)
		})
	}
	h.assertNoSecretsLogged(t, resp)
}

// stalling never answers its activation challenge.
type stalling struct {
	*tpmattester.QuoteAttester
	release chan struct{}
}

func (s stalling) Activate(ctx context.Context, _ []byte) ([]byte, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.release:
		return nil, errors.New("released")
	}
}

// TestHandshakeTimeoutCoversKeyActivation: a node that never answers its
// activation challenge holds the connection only for the handshake
// timeout, which the activation does not extend (the refusal is audited
// within waitAudit's 10 s, long before the client would give up);
// nothing is issued.
func TestHandshakeTimeoutCoversKeyActivation(t *testing.T) {
	testenv.RequireRoot(t)
	h := newHarness(t, harnessOptions{limits: ConnectionLimits{HandshakeTimeout: 500 * time.Millisecond}})
	ca := swtpmtest.CA(t)
	h.trustManufacturer(t, ca)
	s := stalling{QuoteAttester: manufacturedNode(t, ca, policy.RoleWorker), release: make(chan struct{})}
	before := h.snapshot(t)
	done := make(chan error, 1)
	go func() {
		_, err := h.dial(t, s, "").IssueJoinTicket(t.Context(), joinRequest(t, "staller", net.IPv4(10, 0, 0, 23), false))
		done <- err
	}()
	h.waitAudit(t, "handshake", "refused", "handshake_timeout")
	close(s.release) // the client stops stalling and sees the closed connection
	if err := <-done; err == nil {
		t.Fatal("a node that never answered its challenge got a ticket")
	}
	h.assertNothingIssued(t, before)
}
