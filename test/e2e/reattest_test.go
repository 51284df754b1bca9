package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
	"github.com/gatehouse-dev/gatehouse/joinservice/csrapprover"
	"github.com/gatehouse-dev/gatehouse/joinservice/gate"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
	"github.com/gatehouse-dev/gatehouse/mini"
)

// reattestInterval is the local cluster's continuous attestation interval
// (mini's join service values), ±10 %.
const reattestInterval = 10 * time.Second

// kubeletCertLifetime is the test cluster's kubelet certificate lifetime:
// kubelets renew within the test. Not much shorter: a control plane's
// kubelet talks to its own API server, which the upgrade step restarts
// for about a minute; a 3-minute certificate expired during that restart
// (renewal at 70-90 % of its life) and left the kubelet anonymous.
const kubeletCertLifetime = 15 * time.Minute

// extendPCR extends pcr of node's TPM (its swtpm socket) with a digest,
// as a compromised boot component measuring itself would.
func extendPCR(t *testing.T, dir, node string, pcr int) []byte {
	t.Helper()
	rw, err := tpmutil.OpenTPM(filepath.Join(dir, "nodes", node, "tpm", "tpm.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if err := tpm2.PCRExtend(rw, tpmutil.Handle(pcr), tpm2.AlgSHA256, bytes.Repeat([]byte{0xee}, 32), ""); err != nil {
		t.Fatal(err)
	}
	value, err := tpm2.ReadPCR(rw, pcr, tpm2.AlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	return value
}

// acceptMeasurement adds value to the accepted values of pcr in the join
// config's reference values: the join service reloads it.
func acceptMeasurement(ctx context.Context, t *testing.T, client kubernetes.Interface, pcr uint32, value []byte) {
	t.Helper()
	cms := client.CoreV1().ConfigMaps(charts.Namespace)
	cm, err := cms.Get(ctx, "gatehouse-join-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var p policy.Policy
	if err := yaml.Unmarshal([]byte(cm.Data[joinconfig.KeyAttestation]), &p); err != nil {
		t.Fatal(err)
	}
	ref, err := measurements.Parse(p.ReferenceValues, 32)
	if err != nil {
		t.Fatal(err)
	}
	m := ref[pcr]
	m.AlsoAccepted = append(m.AlsoAccepted, value)
	ref[pcr] = m
	data, err := ref.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if p.ReferenceValues, err = yaml.YAMLToJSON(data); err != nil {
		t.Fatal(err)
	}
	doc, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[joinconfig.KeyAttestation] = string(doc)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// tainted reports whether node carries continuous attestation's taint.
func tainted(ctx context.Context, client kubernetes.Interface, node string) (bool, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == gate.TaintKey && t.Effect == corev1.TaintEffectNoExecute
	}), nil
}

// podsOf returns the nodes of app's Running pods.
func podsOf(ctx context.Context, client kubernetes.Interface, app string) ([]string, error) {
	list, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			nodes = append(nodes, p.Spec.NodeName)
		}
	}
	return nodes, nil
}

// testCompromisedWorker changes the measurement of running worker victim
// (its TPM's PCR 4 extended as a compromised boot would) and checks that
// within two intervals its Node is not attested and tainted, its workload
// moves to worker other, and a certificate request as the node is denied;
// with Prometheus alerting on it (prom, when not nil); then that
// accepting the measurement into the policy (hot reload)
// restores it, attested and untainted.
func testCompromisedWorker(ctx context.Context, t *testing.T, dir string, client kubernetes.Interface, victim, other string, prom *promServer) {
	// A workload that may run on either worker, placed on the victim
	// (the other cordoned meanwhile).
	setUnschedulable(ctx, t, client, other, true)
	labels := map[string]string{"app": "mover"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "mover", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
							MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{victim, other}}},
						}}},
					}},
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					Containers: []corev1.Container{{
						Name: "mover", Image: mini.ImageRepository + "/pause:3.10.2", ImagePullPolicy: corev1.PullNever,
						SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
					}},
				},
			},
		},
	}
	if _, err := client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var on []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		on, _ = podsOf(ctx, client, "mover")
		return slices.Equal(on, []string{victim}), nil
	})
	if err != nil {
		t.Fatalf("the workload does not run on %s: on %v", victim, on)
	}
	setUnschedulable(ctx, t, client, other, false)

	// The compromise. The compromised node also uses its kubelet
	// credentials to write itself Attested=True/Verified, over and over:
	// it is tainted all the same, within two intervals.
	pcr4 := extendPCR(t, dir, victim, 4)
	compromised := time.Now()
	stopForging := forgeAttested(ctx, t, dir, victim)
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		return tainted(ctx, client, victim)
	})
	forged := stopForging()
	if err != nil {
		t.Fatalf("%s is not tainted %s after its measurement changed (it patched its own condition %d times): %v", victim, gate.TaintKey, forged, err)
	}
	t.Logf("%s patched its own condition to Verified %d times until it was tainted", victim, forged)
	waitAttested(ctx, t, client, map[string]string{victim: continuous.ReasonEvidenceRejected})
	// The operator is alerted (docs/operations.md, "GatehouseNodeNotAttested").
	prom.waitAlert(ctx, t, "GatehouseNodeNotAttested", victim, true)
	// Two intervals (each up to 10 % longer), and the time a round takes.
	if took, most := time.Since(compromised), 2*reattestInterval*11/10+10*time.Second; took > most {
		t.Errorf("%s was tainted %s after its measurement changed; want within two intervals (%s)", victim, took.Round(time.Second), most)
	} else {
		t.Logf("%s not attested and tainted %s after its measurement changed", victim, took.Round(time.Second))
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		on, _ = podsOf(ctx, client, "mover")
		return slices.Equal(on, []string{other}), nil
	})
	if err != nil {
		t.Fatalf("the workload did not move from %s to %s: on %v", victim, other, on)
	}
	// A certificate renewal as the node is denied, with the reason.
	csr := requestAsNode(ctx, t, dir, victim)
	if c := waitDecided(ctx, t, client, csr); c.Type != certificatesv1.CertificateDenied {
		t.Errorf("a renewal of compromised %s was not denied: %+v", victim, c)
	} else {
		t.Logf("renewal of %s denied: %s: %s", victim, c.Reason, c.Message)
	}

	// The administrator accepts the new measurement (hot reload).
	acceptMeasurement(ctx, t, client, 4, pcr4)
	waitAttested(ctx, t, client, map[string]string{victim: continuous.ReasonVerified})
	prom.waitAlert(ctx, t, "GatehouseNodeNotAttested", victim, false)
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		taint, err := tainted(ctx, client, victim)
		return err == nil && !taint, nil
	})
	if err != nil {
		t.Fatalf("%s is still tainted after the policy accepted its measurement: %v", victim, err)
	}
	if err := client.AppsV1().Deployments("default").Delete(ctx, "mover", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// testEvidenceFlood floods node's evidence endpoint at addr from this host
// (an address on the node network) with 5,000 TLS ClientHellos, 64 at a
// time, for at least two re-verification intervals: the endpoint refuses
// them before any TPM work, and the node stays Verified throughout: its
// record is never anything else, nor its condition.
func testEvidenceFlood(ctx context.Context, t *testing.T, dir string, client kubernetes.Interface, node, addr string) {
	t.Helper()
	waitAttested(ctx, t, client, map[string]string{node: continuous.ReasonVerified})
	before, err := nodeattestation.NewStore(client, charts.Namespace).Get(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var hellos, answered atomic.Int64
	flood, stop := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(flood)
	for range 64 {
		g.Go(func() error {
			for gctx.Err() == nil && (hellos.Load() < 5000 || time.Since(start) < 2*reattestInterval*11/10) {
				hellos.Add(1)
				d := net.Dialer{Timeout: 2 * time.Second}
				conn, err := d.DialContext(gctx, "tcp", addr)
				if err != nil {
					continue
				}
				// An attacker's hello: it verifies nothing.
				tconn := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
				hctx, cancel := context.WithTimeout(gctx, 2*time.Second)
				if tconn.HandshakeContext(hctx) == nil {
					answered.Add(1)
				}
				cancel()
				_ = conn.Close()
			}
			return nil
		})
	}
	// Meanwhile the node's verdict holds, as recorded and as mirrored.
	var flipped string
	sample := time.NewTicker(time.Second)
	defer sample.Stop()
	for time.Since(start) < 2*reattestInterval*11/10 && flipped == "" {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			for _, c := range n.Status.Conditions {
				if c.Type == continuous.ConditionType && c.Reason != continuous.ReasonVerified {
					flipped = c.Reason + ": " + c.Message
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-sample.C:
		}
	}
	_ = g.Wait()
	stop()
	if flipped != "" {
		t.Fatalf("%s was not Verified during a flood of %d hellos on its evidence port: %s", node, hellos.Load(), flipped)
	}
	after, err := nodeattestation.NewStore(client, charts.Namespace).Get(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Attested || !after.Since.Equal(before.Since) {
		t.Fatalf("%s's record after the flood: %+v (before: %+v); want Verified throughout", node, after, before)
	}
	t.Logf("%d hellos in %s on %s's evidence port (%d completed a TLS handshake, none got evidence); it stayed Verified",
		hellos.Load(), time.Since(start).Round(time.Second), node, answered.Load())
}

func setUnschedulable(ctx context.Context, t *testing.T, client kubernetes.Interface, node string, on bool) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, on)
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// forgeAttested patches node's own gatehouse.dev/Attested condition to
// True/Verified with the node's identity (the test's administrator
// impersonating its kubelet, which NodeRestriction lets patch its own
// status), every 50 ms until the returned stop is called, which returns
// how many patches succeeded.
func forgeAttested(ctx context.Context, t *testing.T, dir, node string) (stop func() int) {
	t.Helper()
	asNode := clientAsNode(t, dir, node)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		n := 0
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			patch := fmt.Appendf(nil, `{"status":{"conditions":[{"type":%q,"status":"True","reason":%q,"message":"all good, says the node","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
				continuous.ConditionType, continuous.ReasonVerified, time.Now().UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339))
			if _, err := asNode.CoreV1().Nodes().PatchStatus(ctx, node, patch); err == nil {
				n++
			}
			select {
			case <-ctx.Done():
				done <- n
				return
			case <-tick.C:
			}
		}
	}()
	return func() int {
		cancel()
		return <-done
	}
}

// clientAsNode is a client with node's identity: the test's administrator
// impersonating its kubelet.
func clientAsNode(t *testing.T, dir, node string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "gatehouse-admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node, Groups: []string{"system:nodes", "system:authenticated"}}
	asNode, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return asNode
}

// requestAsNode creates a kubelet client certificate request as node (the
// test's administrator impersonating it) and returns its name.
func requestAsNode(ctx context.Context, t *testing.T, dir, node string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	asNode := clientAsNode(t, dir, node)
	name := fmt.Sprintf("e2e-%s-%d", node, time.Now().UnixNano()%1_000_000)
	if _, err := asNode.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// waitDecided waits for the approver's decision on CSR name.
func waitDecided(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) certificatesv1.CertificateSigningRequestCondition {
	t.Helper()
	var got certificatesv1.CertificateSigningRequestCondition
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		csr, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(csr.Status.Conditions) == 0 {
			return false, nil //nolint:nilerr // not decided yet
		}
		got = csr.Status.Conditions[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("CSR %s was not decided: %v", name, err)
	}
	return got
}

// testKubeletRenewal checks that node's kubelet renewed its client and
// serving certificates through CSRs the join service approved after fresh
// evidence (nobody else approves them), and that it still talks to the
// API server after its first client certificate expired.
func testKubeletRenewal(ctx context.Context, t *testing.T, client kubernetes.Interface, node string) {
	user := "system:node:" + node
	var firstExpiry time.Time
	approved := map[string]bool{}
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, kubeletCertLifetime+2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // the API server may be busy: keep polling
		}
		for _, csr := range list.Items {
			cert := issued(csr)
			if cert == nil || cert.Subject.CommonName != user {
				continue
			}
			if strings.HasPrefix(csr.Spec.Username, "system:bootstrap:") && csr.Spec.SignerName == certificatesv1.KubeAPIServerClientKubeletSignerName &&
				(firstExpiry.IsZero() || cert.NotAfter.Before(firstExpiry)) {
				firstExpiry = cert.NotAfter
			}
			if csr.Spec.Username == user && slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
				return c.Type == certificatesv1.CertificateApproved && c.Reason == csrapprover.ReasonApproved
			}) {
				approved[csr.Spec.SignerName] = true
			}
		}
		if firstExpiry.IsZero() || !approved[certificatesv1.KubeAPIServerClientKubeletSignerName] || !approved[certificatesv1.KubeletServingSignerName] {
			return false, nil
		}
		lease, err := client.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		return err == nil && lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(firstExpiry.Add(10*time.Second)), nil
	})
	if err != nil {
		t.Fatalf("%s: first client certificate expiring %s, attested renewals approved %v: the kubelet did not renew and keep reporting: %v",
			node, firstExpiry, approved, err)
	}
	t.Logf("%s renewed its client and serving certificates, approved after fresh evidence; it reports past its first certificate's expiry (%s)", node, firstExpiry)
}

// issued is the certificate a CSR was issued, or nil.
func issued(csr certificatesv1.CertificateSigningRequest) *x509.Certificate {
	block, _ := pem.Decode(csr.Status.Certificate)
	if block == nil {
		return nil
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return cert
}
