package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
	"github.com/gatehouse-dev/gatehouse/joinservice"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/test/clustertest"
)

// workerAsksForControlPlane boots a fresh machine that measures exactly
// what a local worker measures, on a TPM from the manufacturer the policy
// trusts (as any new worker: nothing of it is registered), and asks the
// running join service for the control-plane role. It must be refused,
// leaving no token, binding or Lease.
func workerAsksForControlPlane(ctx context.Context, t *testing.T, dir string, client kubernetes.Interface) {
	t.Helper()
	spec, err := mini.ReadNodeSpec(filepath.Join(dir, "nodes", "worker-1", "node.json"))
	if err != nil {
		t.Fatal(err)
	}
	tpmDir := t.TempDir()
	if err := swtpm.Manufacture(ctx, tpmDir, swtpm.LocalCA{Dir: filepath.Join(dir, "tpm-ca")}); err != nil {
		t.Fatal(err)
	}
	artefacts, err := mini.BootArtefacts(filepath.Join(spec.BinDir, "gatehouse-bootstrapper"), spec.BootManifest, policy.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	rw := swtpmtest.Boot(t, tpmDir, artefacts)
	attester, err := tpmattester.New(rw, tpmattester.Options{PCRs: mini.PCRs, EKCertificate: tpmattester.EKCertificateRequired})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = attester.Close() })

	caPEM, err := os.ReadFile(filepath.Join(dir, "nodes", "cp-0", "root", "etc", "kubernetes", "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	caHash, err := kubeadm.DiscoveryTokenCACertHashPEM(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := joinerCredentials(attester, caHash)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(clustertest.NodeIP(t, dir, "cp-0")+":9090", grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	req := &joinservicev1.IssueJoinTicketRequest{DiskUuid: uuid.NewString(), CertificateRequest: impostorCSR(t), IsControlPlane: true}
	// The join service may still be settling (Unavailable); then the
	// request is decided.
	var callErr error
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, callErr = joinservicev1.NewJoinServiceClient(conn).IssueJoinTicket(ctx, req)
		return status.Code(callErr) != codes.Unavailable, nil
	})
	if err != nil {
		t.Fatalf("the join service never decided the request: %v (last: %v)", err, callErr)
	}
	if status.Code(callErr) != codes.PermissionDenied || !strings.Contains(callErr.Error(), "role") {
		t.Fatalf("a worker-measured machine asking for the control-plane role: %v, want PermissionDenied naming the role", callErr)
	}
	secrets, err := client.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if strings.Contains(string(s.Data["description"]), "impostor-cp") {
			t.Errorf("the refused machine got bootstrap token %s", s.Name)
		}
	}
	if _, err := client.CoreV1().ConfigMaps(charts.Namespace).Get(ctx, nodebinding.Name("impostor-cp"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused machine's name is bound (%v)", err)
	}
	lease, err := client.CoordinationV1().Leases(charts.Namespace).Get(ctx, joinservice.ControlPlaneLeaseName, metav1.GetOptions{})
	if err == nil && ptr.Deref(lease.Spec.HolderIdentity, "") == "impostor-cp" {
		t.Error("the refused machine holds the control-plane join Lease")
	}
	if log := clustertest.JoinServiceLog(t, dir, "cp-*"); !strings.Contains(log, `"reason":"role_not_attested"`) {
		t.Errorf("the join service did not audit role_not_attested:\n%s", log)
	}
}

// impostorCSR is a valid kubelet CSR for the node impostor-cp.
func impostorCSR(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "system:node:impostor-cp", Organization: []string{"system:nodes"}},
		DNSNames: []string{"impostor-cp"},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
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
