package kmsplugin_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kms/pkg/service"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kmsplugin"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

var discard = slog.New(slog.DiscardHandler)

func clusterKMS(t testing.TB) *kms.ClusterKMS {
	t.Helper()
	secret, salt := make([]byte, 32), make([]byte, 32)
	_, _ = rand.Read(secret)
	_, _ = rand.Read(salt)
	k, err := kms.NewClusterKMS(secret, salt)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

type unavailable struct{}

func (unavailable) GetDataKey(context.Context, string, int) ([]byte, error) {
	return nil, errors.New("the master secret is not unwrapped")
}

// TestPlugin: a DEK round-trips; a retired, future or foreign key ID, a
// tampered ciphertext and a ciphertext moved to another key ID are
// refused; Status names the current KEK and fails while no key can be
// derived.
func TestPlugin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keys := clusterKMS(t)
	v1, err := kmsplugin.New(keys, 1, 1, discard)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := kmsplugin.New(keys, 2, 2, discard)
	if err != nil {
		t.Fatal(err)
	}
	both, err := kmsplugin.New(keys, 2, 1, discard)
	if err != nil {
		t.Fatal(err)
	}
	dek := bytes.Repeat([]byte{0xd5}, 32)
	enc, err := v1.Encrypt(ctx, "uid", dek)
	if err != nil {
		t.Fatal(err)
	}
	if enc.KeyID != "gatehouse-etcd-v1" || bytes.Contains(enc.Ciphertext, dek) {
		t.Fatalf("encrypt: key ID %q, ciphertext holds the DEK: %v", enc.KeyID, bytes.Contains(enc.Ciphertext, dek))
	}
	for _, p := range []*kmsplugin.Plugin{v1, both} {
		got, err := p.Decrypt(ctx, "uid", &service.DecryptRequest{Ciphertext: enc.Ciphertext, KeyID: enc.KeyID})
		if err != nil || !bytes.Equal(got, dek) {
			t.Fatalf("decrypt: %v", err)
		}
	}
	tampered := bytes.Clone(enc.Ciphertext)
	tampered[len(tampered)-1] ^= 1
	for _, tc := range []struct {
		name   string
		plugin *kmsplugin.Plugin
		req    *service.DecryptRequest
		want   string
	}{
		{"retired generation", v2, &service.DecryptRequest{Ciphertext: enc.Ciphertext, KeyID: enc.KeyID}, "is retired"},
		{"future generation", v1, &service.DecryptRequest{Ciphertext: enc.Ciphertext, KeyID: "gatehouse-etcd-v2"}, "newer than"},
		{"foreign key ID", v1, &service.DecryptRequest{Ciphertext: enc.Ciphertext, KeyID: "aws-kms-key"}, "not one of this plugin's"},
		{"leading zero", v1, &service.DecryptRequest{Ciphertext: enc.Ciphertext, KeyID: "gatehouse-etcd-v01"}, "not one of this plugin's"},
		{"tampered", v1, &service.DecryptRequest{Ciphertext: tampered, KeyID: enc.KeyID}, "message authentication failed"},
		{"moved to another key ID", both, &service.DecryptRequest{Ciphertext: enc.Ciphertext, KeyID: "gatehouse-etcd-v2"}, "message authentication failed"},
		{"short", v1, &service.DecryptRequest{Ciphertext: []byte{1}, KeyID: enc.KeyID}, "too short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.plugin.Decrypt(ctx, "uid", tc.req)
			if err == nil || !strings.Contains(err.Error(), tc.want) || got != nil {
				t.Fatalf("decrypt = %x, %v; want an error naming %q", got, err, tc.want)
			}
		})
	}
	st, err := both.Status(ctx)
	if err != nil || st.KeyID != "gatehouse-etcd-v2" || st.Healthz != "ok" || st.Version != "v2" {
		t.Fatalf("status %+v, %v", st, err)
	}
	down, _ := kmsplugin.New(unavailable{}, 1, 1, discard)
	if _, err := down.Status(ctx); err == nil {
		t.Fatal("status healthy while no key can be derived")
	}
	if _, err := kmsplugin.New(keys, 1, 2, discard); err == nil {
		t.Fatal("oldest generation above the current one accepted")
	}
}

// servePlugin serves a plugin of generations oldest..current on socket
// until the returned stop is called.
func servePlugin(t testing.TB, socket string, keys *kms.ClusterKMS, current, oldest int) (stop func()) {
	t.Helper()
	p, err := kmsplugin.New(keys, current, oldest, discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kmsplugin.Serve(ctx, socket, p) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("plugin: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// etcdValue reads key's raw value from etcd through its JSON gateway.
func etcdValue(t *testing.T, etcdURL, key string) []byte {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(key))})
	resp, err := http.Post(etcdURL+"/v3/kv/range", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		KVs []struct {
			Value []byte `json:"value"`
		} `json:"kvs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.KVs) != 1 {
		t.Fatalf("reading %s from etcd: %v (%d values)", key, err, len(out.KVs))
	}
	return out.KVs[0].Value
}

// poll calls f until it returns nil or the deadline passes.
func poll(t *testing.T, what string, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestEncryptionAtRest runs a real kube-apiserver and etcd with the
// EncryptionConfiguration clusters get (kubeadm.EncryptionConfiguration)
// and the plugin on a Unix socket: a Secret's bytes in etcd are the KMS v2
// envelope, not the plaintext, and read back; with the plugin down the API
// server reports it in /readyz and loses nothing; after a KEK rotation
// (generation 2) new writes use the new KEK, and rewriting every Secret
// (`kubectl get secrets -A -o json | kubectl replace -f -`, as the
// Kubernetes docs say) moves the old ones to it.
func TestEncryptionAtRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A short path: Unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "gh-kms")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "kms-v2.sock")
	config, err := kubeadm.EncryptionConfiguration(socket)
	if err != nil {
		t.Fatal(err)
	}
	configFile := filepath.Join(dir, "encryption-config.yaml")
	if err := os.WriteFile(configFile, config, 0o600); err != nil {
		t.Fatal(err)
	}
	keys := clusterKMS(t)
	stop := servePlugin(t, socket, keys, 1, 1)
	env := testenv.New(t, testenv.Options{APIServerArgs: []string{"--encryption-provider-config=" + configFile}})
	client, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	secrets := client.CoreV1().Secrets("default")
	marker := fmt.Sprintf("gatehouse-plaintext-%d", time.Now().UnixNano())
	create := func(name string) {
		t.Helper()
		if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"v": marker}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Secret %s: %v", name, err)
		}
	}
	readBack := func(name string) error {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(s.Data["v"]) != marker {
			return fmt.Errorf("secret %s reads back %q", name, s.Data["v"])
		}
		return nil
	}
	stored := func(name string) []byte { return etcdValue(t, env.EtcdURL, "/registry/secrets/default/"+name) }
	// The provider kubeadm.EncryptionConfiguration names.
	prefix := []byte("k8s:enc:kms:v2:gatehouse:")

	create("s1")
	raw := stored("s1")
	if !bytes.HasPrefix(raw, prefix) || bytes.Contains(raw, []byte(marker)) || !bytes.Contains(raw, []byte(kmsplugin.KeyID(1))) {
		t.Fatalf("etcd holds %q…, want the KMS v2 envelope of KEK %s without the plaintext", raw[:min(len(raw), 60)], kmsplugin.KeyID(1))
	}
	if err := readBack("s1"); err != nil {
		t.Fatal(err)
	}

	// The plugin down: the API server says so, and keeps what it has.
	stop()
	readyz := func() (string, error) {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").Param("verbose", "true").DoRaw(ctx)
		return string(body), err
	}
	poll(t, "/readyz failing on the KMS provider", 3*time.Minute, func() error {
		body, err := readyz()
		if err == nil || !strings.Contains(body+err.Error(), "kms-providers failed") {
			return fmt.Errorf("readyz: %w", err)
		}
		return nil
	})
	t.Logf("plugin down: reading a Secret it encrypted: %v (the API server caches decrypted DEKs)", readBack("s1"))

	// Back, at KEK generation 2: nothing lost, new writes use the new KEK.
	servePlugin(t, socket, keys, 2, 1)
	poll(t, "/readyz ok", 3*time.Minute, func() error { _, err := readyz(); return err })
	if err := readBack("s1"); err != nil {
		t.Fatal(err)
	}
	n := 0
	poll(t, "a new Secret encrypted with KEK generation 2", 3*time.Minute, func() error {
		n++
		name := fmt.Sprintf("probe-%d", n)
		create(name)
		if !bytes.Contains(stored(name), []byte(kmsplugin.KeyID(2))) {
			return errors.New("still the old KEK")
		}
		return nil
	})
	if !bytes.Contains(stored("s1"), []byte(kmsplugin.KeyID(1))) {
		t.Fatal("s1 moved to the new KEK before it was rewritten")
	}
	kubectl := filepath.Join(env.BinDir, "kubectl")
	get := exec.CommandContext(ctx, kubectl, "--kubeconfig", env.KubeconfigPath, "get", "secrets", "-A", "-o", "json")
	list, err := get.Output()
	if err != nil {
		t.Fatalf("kubectl get secrets: %v", err)
	}
	replace := exec.CommandContext(ctx, kubectl, "--kubeconfig", env.KubeconfigPath, "replace", "-f", "-")
	replace.Stdin = bytes.NewReader(list)
	if out, err := replace.CombinedOutput(); err != nil {
		t.Fatalf("kubectl replace: %v\n%s", err, out)
	}
	if raw := stored("s1"); !bytes.Contains(raw, []byte(kmsplugin.KeyID(2))) || bytes.Contains(raw, []byte(marker)) {
		t.Fatal("s1 is not encrypted with KEK generation 2 after the rewrite")
	}
	if err := readBack("s1"); err != nil {
		t.Fatal(err)
	}
}

// TestServeSocket: the plugin's socket replaces a stale file and only its
// owner (the API server's user, root) may connect: mode 0600.
func TestServeSocket(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "gh-kms")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "kms", "kms-v2.sock")
	if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(socket, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := servePlugin(t, socket, clusterKMS(t), 1, 1)
	defer stop()
	poll(t, "the socket", 10*time.Second, func() error {
		fi, err := os.Stat(socket)
		switch {
		case err != nil:
			return err
		case fi.Mode().Type() != os.ModeSocket:
			return fmt.Errorf("%s is %v, not a socket", socket, fi.Mode().Type())
		case fi.Mode().Perm() != 0o600:
			return fmt.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
		}
		return nil
	})
}
