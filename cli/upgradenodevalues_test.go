package cli

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
)

// TestUpgradeApplyNodeValuesRefused: signed node values that do not
// verify are refused naming the file, before the cluster is read or
// anything changes (the kubeconfig does not even exist).
func TestUpgradeApplyNodeValuesRefused(t *testing.T) {
	b := buildSignedValues(t)
	run(t, "image", "sign-values", "--key", b.privKey, "--in", b.unsigned, "--out", b.signed, "--force")
	other := filepath.Join(t.TempDir(), "other.pub")
	run(t, "image", "keygen", "--private-key", filepath.Join(t.TempDir(), "other.key"), "--public-key", other)
	data, err := os.ReadFile(b.signed)
	if err != nil {
		t.Fatal(err)
	}
	tampered := filepath.Join(t.TempDir(), "tampered.signed.json")
	// One character of the base64 payload changed.
	i := strings.Index(string(data), `"payload":"`) + len(`"payload":"`) + 40
	changed := []byte(string(data))
	changed[i] ^= 0x01
	if err := os.WriteFile(tampered, changed, 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "absent.conf")
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no key", []string{"--node-values", b.signed}, "--node-values needs --node-values-key"},
		{"another key", []string{"--node-values", b.signed, "--node-values-key", other}, "--node-values " + b.signed + " (nothing was changed)"},
		{"a changed payload", []string{"--node-values", tampered, "--node-values-key", b.pubKey}, "--node-values " + tampered + " (nothing was changed)"},
		{"a key without values", []string{"--node-values-key", b.pubKey}, "--node-values-key without --node-values"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runErr(t, append([]string{"upgrade", "apply", "--kubeconfig", kubeconfig, "--backup-dir", t.TempDir()}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q\n%s", err, tt.wantErr, out)
			}
			if strings.Contains(err.Error(), kubeconfig) {
				t.Errorf("the refusal reached for the cluster: %v", err)
			}
		})
	}
}

// TestNodeProofs: fresh evidence is fetched from every Node's evidence
// endpoint (a real one over the simulator TPM) and verified; a node that
// does not answer, or reports no address, is an error naming it, so that
// nothing is retired on a partial view.
func TestNodeProofs(t *testing.T) {
	sim, a := bootSimulator(t)
	n := startNodeOn(t, sim, a)
	dir := t.TempDir()
	cfg, err := clusterconfig.Load(writeConfig(t, dir, n, false))
	if err != nil {
		t.Fatal(err)
	}
	appraisal, err := cfg.Appraisal(nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	// No cluster CA file yet: the endpoint answers anyone, as before a join.
	go func() {
		served <- atls.EvidenceEndpoint{Attester: a, ClientCAFile: filepath.Join(dir, "ca.crt")}.Serve(ctx, lis)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; !errors.Is(err, context.Canceled) {
			t.Errorf("the evidence endpoint ended with %v", err)
		}
	})
	port := lis.Addr().(*net.TCPAddr).Port
	node := func(name, ip string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if ip != "" {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		}
		return n
	}
	// 127.0.0.2 is loopback too, where nothing listens on the port.
	client := fake.NewClientset(node("cp-0", "127.0.0.1"), node("worker-1", "127.0.0.2"), node("worker-2", ""))
	proofs, err := nodeProofs(t.Context(), client, atls.EvidenceFetcher{}, appraisal, "", port)
	if err == nil || !strings.Contains(err.Error(), "worker-1: ") || !strings.Contains(err.Error(), "node worker-2 reports no InternalIP") {
		t.Fatalf("error %v, want worker-1 and worker-2 named", err)
	}
	if strings.Contains(err.Error(), "cp-0") {
		t.Errorf("the node that answered is named in %v", err)
	}
	if len(proofs) != 1 || proofs[0].Node != "cp-0" || len(proofs[0].Measured) == 0 {
		t.Fatalf("proofs %+v, want cp-0's verified measurements", proofs)
	}
}
