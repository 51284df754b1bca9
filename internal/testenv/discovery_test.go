package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/cluster-bootstrap/token/jws"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
)

// TestBootstrapTokenDiscovery proves the environment is a real control plane:
// the real bootstrapsigner signs cluster-info for a new bootstrap token, and
// the real `kubeadm join --dry-run` discovers the cluster with it, pinning the
// CA by its hash.
func TestBootstrapTokenDiscovery(t *testing.T) {
	RequireRoot(t)
	env := New(t, Options{ControllerManager: true})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.PublishClusterInfo(ctx); err != nil {
		t.Fatal(err)
	}
	token, err := CreateBootstrapToken(ctx, client, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id, secret, _ := strings.Cut(token, ".")

	// The bootstrapsigner controller signs cluster-info for the new token.
	if err := WaitClusterInfoSigned(ctx, client, id); err != nil {
		t.Fatal(err)
	}
	signed, err := client.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sig := signed.Data[bootstrapapi.JWSSignatureKeyPrefix+id]
	if !jws.DetachedTokenIsValid(sig, signed.Data[bootstrapapi.KubeConfigKey], id, secret) {
		t.Fatalf("signature %s does not verify with the token", sig)
	}

	caHash, err := kubeadm.DiscoveryTokenCACertHashPEM(env.CACertPEM)
	if err != nil {
		t.Fatal(err)
	}
	wrongHash := "sha256:" + strings.Repeat("ab", 32)
	endpoint := strings.TrimPrefix(env.APIServerURL, "https://")

	hostKubernetes := snapshotDir(t, "/etc/kubernetes")
	hostKubelet := snapshotDir(t, "/var/lib/kubelet")

	tests := []struct {
		name    string
		token   string
		caHash  string
		wantErr string // empty: kubeadm must succeed
	}{
		{name: "right token and CA hash succeed", token: id + "." + secret, caHash: caHash},
		{
			// kubeadm names the hash of the CA it found, which must be the one we computed.
			name: "wrong CA hash is refused", token: id + "." + secret, caHash: wrongHash,
			wantErr: fmt.Sprintf("cluster CA found in cluster-info ConfigMap is invalid: none of the public keys %q are pinned", caHash),
		},
		{
			name: "wrong token secret is refused", token: id + "." + strings.Repeat("0", 16), caHash: caHash,
			wantErr: "failed to verify JWS signature of received cluster info object",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scratch := t.TempDir()
			out, err := RunIsolated(ctx, scratch, filepath.Join(env.BinDir, "kubeadm"), "join", endpoint,
				"--token", tt.token,
				"--discovery-token-ca-cert-hash", tt.caHash,
				"--dry-run",
				"--node-name", "testenv-worker",
				"--cri-socket", "unix:///run/containerd/containerd.sock",
				"--ignore-preflight-errors", "all",
				"--v", "1",
			)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("kubeadm join --dry-run: %v\n%s", err, out)
				}
				// Discovery used this cluster's cluster-info, not kubeadm's dry-run stand-in.
				want := "Cluster info signature and contents are valid and TLS certificate validates against pinned roots"
				if !strings.Contains(string(out), want) || !strings.Contains(string(out), env.APIServerURL) {
					t.Fatalf("kubeadm output lacks %q for %s:\n%s", want, env.APIServerURL, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("kubeadm join --dry-run succeeded, want %q:\n%s", tt.wantErr, out)
			}
			if !strings.Contains(string(out), tt.wantErr) {
				t.Fatalf("kubeadm output lacks %q:\n%s", tt.wantErr, out)
			}
		})
	}

	// kubeadm's dry run wrote into the overlays only.
	if got := snapshotDir(t, "/etc/kubernetes"); got != hostKubernetes {
		t.Errorf("host /etc/kubernetes changed:\nbefore: %s\nafter:  %s", hostKubernetes, got)
	}
	if got := snapshotDir(t, "/var/lib/kubelet"); got != hostKubelet {
		t.Errorf("host /var/lib/kubelet changed:\nbefore: %s\nafter:  %s", hostKubelet, got)
	}
}

// snapshotDir describes the tree under dir (paths, sizes, mtimes), or notes
// that it does not exist.
func snapshotDir(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %d;", path, info.Size(), info.ModTime().UnixNano())
		return nil
	})
	if os.IsNotExist(err) {
		return dir + " does not exist"
	}
	if err != nil {
		t.Fatalf("walking %s: %v", dir, err)
	}
	return b.String()
}
