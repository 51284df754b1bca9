package csrapprover

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
)

// TestApproverSilentNodeDelaysNoOne: a node that never answers tied up
// every approval worker for a whole fetch per CSR (the freshness cache's
// time was taken before the check, so each CSR checked again), delaying
// honest renewals. Now it has one check in flight, no worker waits for it,
// and the honest node's renewal is approved within the per-node deadline.
func TestApproverSilentNodeDelaysNoOne(t *testing.T) {
	r := newAttackRig(t, map[string]string{"worker-good": "127.0.0.1"}, map[string]string{"worker-silent": "127.0.0.6"})
	ctx := t.Context()
	const deadline = 10 * time.Second
	credentialGate, err := gate.New(r.pol, r.caches.records, r.caches.nodes, r.log, r.reg)
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingChecker{NodeChecker: r.verifier, node: "worker-silent"}
	approver, err := New(Config{Client: r.client, Checker: counted, Gate: credentialGate,
		Bindings: nodebinding.New(r.client, namespace, time.Now), Events: continuous.NewEventRecorder(ctx, r.client),
		FetchTimeout: deadline, Workers: 2, Log: r.log, Registerer: r.reg})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopApprover := context.WithCancel(ctx)
	defer stopApprover()
	go func() { _ = approver.Run(runCtx) }()
	create := func(name, node string) {
		t.Helper()
		if _, err := asNode(t, r.env.Config, node).CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       certificatesv1.CertificateSigningRequestSpec{Request: csrPEM(t, nodeSubject(node), nil, nil), SignerName: signerKubeletClient, Usages: clientUsages},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		create("silent-"+strconv.Itoa(i), "worker-silent")
	}
	start := time.Now()
	create("honest", "worker-good")
	var approvedAt time.Duration
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 3*deadline, true, func(ctx context.Context) (bool, error) {
		csr, err := r.client.CertificatesV1().CertificateSigningRequests().Get(ctx, "honest", metav1.GetOptions{})
		if err != nil || decidable(csr) {
			return false, nil //nolint:nilerr // not decided yet
		}
		approvedAt = time.Since(start)
		return csr.Status.Conditions[0].Type == certificatesv1.CertificateApproved, nil
	})
	if err != nil {
		t.Fatalf("the honest renewal was not approved: %v", err)
	}
	if approvedAt > deadline/2 {
		t.Errorf("the honest renewal was approved %v after it was made, behind the silent node's requests (deadline %v)", approvedAt, deadline)
	}
	// The silent node's requests are denied once its one check ends.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*deadline, true, func(ctx context.Context) (bool, error) {
		for i := range 6 {
			csr, err := r.client.CertificatesV1().CertificateSigningRequests().Get(ctx, "silent-"+strconv.Itoa(i), metav1.GetOptions{})
			if err != nil || decidable(csr) {
				return false, nil //nolint:nilerr // not decided yet
			}
			if csr.Status.Conditions[0].Type != certificatesv1.CertificateDenied || csr.Status.Conditions[0].Reason != continuous.ReasonUnreachable {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("the silent node's requests were not all denied Unreachable: %v", err)
	}
	if n := counted.checks.Load(); n > 2 {
		t.Errorf("the silent node was checked %d times for 6 requests, want one check in flight (and at most one more after the freshness)", n)
	}
}

// countingChecker counts the checks of one node.
type countingChecker struct {
	*continuous.NodeChecker
	node   string
	checks atomic.Int32
}

func (c *countingChecker) Check(ctx context.Context, node *corev1.Node) (continuous.Outcome, error) {
	if node.Name == c.node {
		c.checks.Add(1)
	}
	return c.NodeChecker.Check(ctx, node)
}
