package kms

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ThalesGroup/crypto11"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

const softHSMModule = "/usr/lib/softhsm/libsofthsm2.so"

// newSoftHSM creates a SoftHSM2 token with an AES-256 KEK in a fresh
// directory and returns the URI naming it.
func newSoftHSM(t *testing.T) *PKCS11URI {
	t.Helper()
	if _, err := os.Stat(softHSMModule); err != nil {
		t.Fatalf("SoftHSM2 is not installed (%v): install the Debian package softhsm2 (make setup does)", err)
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	if err := os.WriteFile(conf, []byte("directories.tokendir = "+tokens+"\nobjectstore.backend = file\nlog.level = ERROR\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SOFTHSM2_CONF", conf)
	pinFile := filepath.Join(dir, "pin")
	if err := os.WriteFile(pinFile, []byte("1234\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("softhsm2-util", "--init-token", "--free", "--label", "gatehouse", "--pin", "1234", "--so-pin", "5678").CombinedOutput(); err != nil {
		t.Fatalf("softhsm2-util --init-token: %v\n%s", err, out)
	}
	ctx, err := crypto11.Configure(&crypto11.Config{Path: softHSMModule, TokenLabel: "gatehouse", Pin: "1234"})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if _, err := ctx.GenerateSecretKeyWithLabel([]byte{1}, []byte("kek"), 256, crypto11.CipherAES); err != nil {
		t.Fatalf("generating KEK: %v", err)
	}
	return &PKCS11URI{Module: softHSMModule, Token: "gatehouse", PinSource: "file:" + pinFile, KeyLabel: "kek"}
}

func TestPKCS11KMS(t *testing.T) {
	uri := newSoftHSM(t)
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	hsm, kek, err := OpenPKCS11(uri)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hsm.Close() })
	ctx := context.Background()
	store := NewSecretStore(client, "kube-system")

	// 100 concurrent first requests, spread over two KMS instances (as two
	// key service replicas sharing the API server), all get the same key.
	replicas := []*PKCS11KMS{NewPKCS11KMS(kek, store), NewPKCS11KMS(kek, store)}
	const n = 100
	keys := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], errs[i] = replicas[i%2].GetDEK(ctx, "disk-1", 32) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("request %d got a different key than request 0", i)
		}
	}
	secrets, err := client.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=gatehouse-keyservice"})
	if err != nil {
		t.Fatal(err)
	}
	if len(secrets.Items) != 1 {
		t.Fatalf("%d DEK Secrets after 100 first requests for one id, want 1", len(secrets.Items))
	}
	if bytes.Contains(secrets.Items[0].Data[wrappedKey], keys[0]) {
		t.Fatal("the stored blob contains the plaintext key")
	}

	// A new instance (a restarted key service) unwraps the same key; a
	// shorter request gets a prefix; another id gets another key.
	fresh := NewPKCS11KMS(kek, store)
	again, err := fresh.GetDEK(ctx, "disk-1", 32)
	if err != nil || !bytes.Equal(again, keys[0]) {
		t.Fatalf("after restart: %x, %v; want the stored key", again, err)
	}
	short, err := fresh.GetDEK(ctx, "disk-1", 16)
	if err != nil || !bytes.Equal(short, keys[0][:16]) {
		t.Fatalf("16-byte request: %v; want a prefix of the key", err)
	}
	other, err := fresh.GetDEK(ctx, "disk-2", 32)
	if err != nil || bytes.Equal(other, keys[0]) {
		t.Fatalf("another id: %v (same key: %t)", err, bytes.Equal(other, keys[0]))
	}

	// A blob moved to another id's Secret does not unwrap.
	blob := secrets.Items[0].Data[wrappedKey]
	if _, err := fresh.unwrap("disk-2", blob); err == nil {
		t.Fatal("a wrapped key unwrapped under another id")
	}
}

func TestOpenPKCS11Errors(t *testing.T) {
	uri := newSoftHSM(t)
	wrongLabel := *uri
	wrongLabel.KeyLabel = "missing"
	if _, _, err := OpenPKCS11(&wrongLabel); err == nil {
		t.Fatal("opened a KEK that does not exist")
	}
	noPIN := *uri
	noPIN.PinSource = "file:/nonexistent/pin"
	if _, _, err := OpenPKCS11(&noPIN); err == nil {
		t.Fatal("opened the token without a PIN")
	}
}
