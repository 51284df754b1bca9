package keyservice

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kmstest"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOpenKMS(t *testing.T) {
	dir := t.TempDir()
	secretFile := writeFile(t, dir, "secret", string(testSecret))
	saltFile := writeFile(t, dir, "salt", string(testSalt))
	uriFile := writeFile(t, dir, "uri", kms.ClusterKMSURIString(testSecret, testSalt)+"\n")
	reference, _ := kms.NewClusterKMS(testSecret, testSalt)
	want, _ := reference.GetDataKey(context.Background(), "measurementSecret", 32)

	tests := []struct {
		name    string
		cfg     KMSConfig
		wantErr string
	}{
		{name: "master secret and salt files", cfg: KMSConfig{MasterSecretFile: secretFile, SaltFile: saltFile}},
		{name: "cluster-kms URI file", cfg: KMSConfig{URIFile: uriFile}},
		{name: "nothing", cfg: KMSConfig{}, wantErr: "no key source"},
		{name: "both", cfg: KMSConfig{URIFile: uriFile, SaltFile: saltFile}, wantErr: "not both"},
		{name: "short salt", cfg: KMSConfig{MasterSecretFile: secretFile, SaltFile: writeFile(t, dir, "short", "x")}, wantErr: "master salt has 1 bytes"},
		{name: "bad URI", cfg: KMSConfig{URIFile: writeFile(t, dir, "bad", "kms://vault")}, wantErr: "unknown KMS backend"},
		{name: "pkcs11 without Kubernetes", cfg: KMSConfig{URIFile: writeFile(t, dir, "p11", "kms://pkcs11?module=/x.so&token=t&pin-source=file:/p&key-label=k")}, wantErr: "client and namespace are needed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, closer, err := OpenKMS(context.Background(), tt.cfg, discardLog, prometheus.NewRegistry())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer closer.Close()
			got, err := keys.GetDataKey(context.Background(), "measurementSecret", 32)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("key differs from the derivation: %v", err)
			}
		})
	}
}

// TestPKCS11KeyServiceLogsNoKeys runs the key service on SoftHSM2 and the
// real API server, through every request path, and checks its logs.
func TestPKCS11KeyServiceLogsNoKeys(t *testing.T) {
	uri := kmstest.NewSoftHSM(t)
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	uriFile := writeFile(t, t.TempDir(), "uri", "kms://pkcs11?module="+uri.Module+"&token="+uri.Token+"&pin-source="+uri.PinSource+"&key-label="+uri.KeyLabel)
	keys, closer, err := OpenKMS(context.Background(), KMSConfig{URIFile: uriFile, Client: client, Namespace: "kube-system"}, discardLog, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	h := newHarness(t, keys)
	js := h.joinService(t)
	ctx := context.Background()
	var issued [][]byte
	for _, req := range []*keyservicev1.GetDataKeyRequest{
		{DataKeyId: "disk-a", Length: 32}, {DataKeyId: "disk-a", Length: 64}, {DataKeyId: "measurementSecret", Length: 32},
		{DataKeyId: "", Length: 32}, {DataKeyId: "a/b", Length: 32}, {DataKeyId: "x", Length: 99},
	} {
		resp, err := js.GetDataKey(ctx, req)
		if err == nil {
			issued = append(issued, resp.GetDataKey())
		}
	}
	if len(issued) != 3 {
		t.Fatalf("%d keys issued, want 3", len(issued))
	}
	if !bytes.Equal(issued[0], issued[1][:32]) {
		t.Fatal("a 32-byte key is not a prefix of the 64-byte key of the same id")
	}
	testkit.AssertNoSecrets(t, h.logs.String(), issued)
}
