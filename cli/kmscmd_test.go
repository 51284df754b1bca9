package cli

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek/kektest"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// TestInitWithExternalKMSAndRewrap initialises a node with masterSecretKEK
// naming a key of a real AWS KMS API server (local-kms): the master secret
// is stored only wrapped, on the admin's machine and on the node. `kms
// rewrap` then moves it to another key, updating the key service's Secret;
// with the first key disabled it still unwraps to the same secret. A
// re-wrap while the KMS is down changes nothing.
func TestInitWithExternalKMSAndRewrap(t *testing.T) {
	l := kektest.NewLocalKMS(t)
	keyA, keyB := l.CreateKey(), l.CreateKey()
	// The CLI takes AWS credentials from the SDK's default chain.
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIAGATEHOUSETEST", "AWS_SECRET_ACCESS_KEY": "test-secret", "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
	n := startNode(t)
	dir := t.TempDir()
	t.Chdir(dir)
	config := writeConfig(t, dir, n, false)
	data, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	data = append(data, []byte("masterSecretKEK: "+l.URI(keyA).String()+"\n")...)
	if err := os.WriteFile(config, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("secret", []byte(n.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret")

	ctx := context.Background()
	stored, err := clusterconfig.ReadMasterSecret(clusterconfig.DefaultMasterSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	if stored.KMS == "" || len(stored.Key) != 0 || !strings.Contains(stored.KMS, "key-id="+keyA) {
		t.Fatalf("the master secret file holds %+v, want only the URI of key %s carrying the wrapped secret", stored, keyA)
	}
	plain, err := stored.Unwrapped(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(n.root, kms.URIFile)); string(got) != stored.KMS {
		t.Errorf("the node stored %q for its key service, want the wrapped secret's URI", got)
	}
	for _, root := range []string{dir, n.root} {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if content, _ := os.ReadFile(path); len(content) > 0 {
					testkit.AssertNoSecrets(t, string(content), [][]byte{plain.Key})
				}
			}
			return err
		})
	}

	client := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "gatehouse-kms", Namespace: charts.Namespace},
		Data:       map[string][]byte{"kms-uri": []byte(stored.KMS)},
	})
	opts := rewrapOptions{
		masterSecretFile: clusterconfig.DefaultMasterSecretFile, kek: l.URI(keyB).String(),
		namespace: charts.Namespace, secret: "gatehouse-kms", secretKey: "kms-uri", timeout: time.Minute,
	}
	var out bytes.Buffer
	if err := runRewrap(ctx, &out, opts, client); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Disable or retire the old key only after that") {
		t.Errorf("rewrap output does not say when to retire the old key:\n%s", out.String())
	}
	l.SetKeyEnabled(keyA, false)
	moved, err := clusterconfig.ReadMasterSecret(clusterconfig.DefaultMasterSecretFile)
	if err != nil {
		t.Fatal(err)
	}
	again, err := moved.Unwrapped(ctx)
	if err != nil || !bytes.Equal(again.Key, plain.Key) || !strings.Contains(moved.KMS, "key-id="+keyB) {
		t.Fatalf("after the re-wrap to key %s with key %s disabled: %v, or another secret", keyB, keyA, err)
	}
	sec, err := client.CoreV1().Secrets(charts.Namespace).Get(ctx, "gatehouse-kms", metav1.GetOptions{})
	if err != nil || string(sec.Data["kms-uri"]) != moved.KMS {
		t.Fatalf("the key service's Secret is not the re-wrapped URI: %v", err)
	}

	// The KMS down: nothing changes.
	before, _ := os.ReadFile(clusterconfig.DefaultMasterSecretFile)
	l.Stop()
	opts.kek, opts.timeout = "", 20*time.Second
	if err := runRewrap(ctx, &out, opts, client); err == nil || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("rewrap with the KMS down: %v, want an error saying nothing was changed", err)
	}
	l.Start()
	if after, _ := os.ReadFile(clusterconfig.DefaultMasterSecretFile); !bytes.Equal(before, after) {
		t.Fatal("a failed re-wrap changed the master secret file")
	}
}

// TestRewrapPlainNeedsKEK: a plain master secret file is wrapped only when
// a KEK is named.
func TestRewrapPlainNeedsKEK(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(file, []byte(`{"key":"`+strings.Repeat("A", 44)+`","salt":"`+strings.Repeat("B", 44)+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	err := runRewrap(context.Background(), &bytes.Buffer{}, rewrapOptions{masterSecretFile: file, timeout: time.Minute}, nil)
	if err == nil || !strings.Contains(err.Error(), "holds the master secret in plain: give --kek") {
		t.Fatalf("error = %v", err)
	}
}
