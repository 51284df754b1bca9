package cli

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
)

// writeKubeconfig writes a kubeconfig authenticating with certPEM/keyPEM.
func writeKubeconfig(t *testing.T, path string, certPEM, keyPEM []byte) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://192.0.2.10:6443"}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyANodeInACluster: a node that belongs to a cluster refuses an
// anonymous `verify --node`, which says to pass --kubeconfig; the admin
// kubeconfig's certificate is answered (named, or the default file in the
// working directory); a kubelet's kubeconfig is refused, naming it.
func TestVerifyANodeInACluster(t *testing.T) {
	sim, a := bootSimulator(t)
	n := startNodeOn(t, sim, a)
	dir := t.TempDir()
	t.Chdir(dir)
	config := writeConfig(t, dir, n, false)

	ca, caPEM, _, err := clusterpki.GenerateCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- atls.EvidenceEndpoint{Attester: a, ClientCAFile: caFile}.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; !errors.Is(err, context.Canceled) {
			t.Errorf("the evidence endpoint ended with %v", err)
		}
	})
	node := lis.Addr().String()

	adminCert, adminKey, err := ca.SignAdmin("alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	writeKubeconfig(t, "admin.conf", adminCert, adminKey)
	kubeletCert, kubeletKey, err := ca.SignKubeletClient("worker-1", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	writeKubeconfig(t, "kubelet.conf", kubeletCert, kubeletKey)

	for _, tt := range []struct {
		name string
		args []string
		says string // "" when verified
	}{
		{"anonymous", nil, "refused this anonymous caller"},
		{"the admin kubeconfig", []string{"--kubeconfig", "admin.conf"}, ""},
		{"a kubelet's kubeconfig", []string{"--kubeconfig", "kubelet.conf"}, "refused the client certificate of kubelet.conf"},
		{"a kubeconfig that is not there", []string{"--kubeconfig", "missing.conf"}, "missing.conf"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runErr(t, append([]string{"verify", "--config", config, "--node", node}, tt.args...)...)
			if tt.says == "" {
				if err != nil || !strings.Contains(out, "is verified") {
					t.Fatalf("verify: %v\n%s", err, out)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("verify: %v, want an error saying %q\n%s", err, tt.says, out)
			}
			if tt.name == "anonymous" && !strings.Contains(err.Error(), "--kubeconfig") {
				t.Errorf("the refusal does not say to pass --kubeconfig: %v", err)
			}
		})
	}

	// The admin kubeconfig `gatehouse init` wrote into the working
	// directory is presented without the flag.
	if err := os.Rename("admin.conf", clusterconfig.DefaultKubeconfig); err != nil {
		t.Fatal(err)
	}
	if out := run(t, "verify", "--config", config, "--node", node); !strings.Contains(out, "is verified") {
		t.Fatalf("verify with the default admin kubeconfig:\n%s", out)
	}
}
