package secretstore_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kmstest"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/keyservice/secretstore"
)

func TestPKCS11KMS(t *testing.T) {
	uri := kmstest.NewSoftHSM(t)
	env := testenv.New(t, testenv.Options{})
	client, err := env.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	hsm, kek, err := kms.OpenPKCS11(uri)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hsm.Close() })
	ctx := context.Background()
	store := secretstore.New(client, "kube-system")

	// 100 concurrent first requests, spread over two KMS instances (as two
	// key service replicas sharing the API server), all get the same key.
	replicas := []*kms.PKCS11KMS{kms.NewPKCS11KMS(kek, store), kms.NewPKCS11KMS(kek, store)}
	const n = 100
	keys := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], errs[i] = replicas[i%2].GetDataKey(ctx, "disk-1", 32) })
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
	if bytes.Contains(secrets.Items[0].Data["wrapped-dek"], keys[0]) {
		t.Fatal("the stored blob contains the plaintext key")
	}

	// A new instance (a restarted key service) unwraps the same key; a
	// shorter request gets a prefix; another id gets another key.
	fresh := kms.NewPKCS11KMS(kek, store)
	again, err := fresh.GetDataKey(ctx, "disk-1", 32)
	if err != nil || !bytes.Equal(again, keys[0]) {
		t.Fatalf("after restart: %x, %v; want the stored key", again, err)
	}
	short, err := fresh.GetDataKey(ctx, "disk-1", 16)
	if err != nil || !bytes.Equal(short, keys[0][:16]) {
		t.Fatalf("16-byte request: %v; want a prefix of the key", err)
	}
	other, err := fresh.GetDataKey(ctx, "disk-2", 32)
	if err != nil || bytes.Equal(other, keys[0]) {
		t.Fatalf("another id: %v (same key: %t)", err, bytes.Equal(other, keys[0]))
	}

	// A blob moved to another id's Secret does not unwrap.
	blob := secrets.Items[0].Data["wrapped-dek"]
	if created, err := store.Create(ctx, "disk-3", blob); err != nil || !created {
		t.Fatalf("planting a moved blob: %t, %v", created, err)
	}
	if _, err := fresh.GetDataKey(ctx, "disk-3", 32); err == nil || !strings.Contains(err.Error(), "moved to another id") {
		t.Fatalf("a wrapped key moved to another id: %v, want it refused", err)
	}
}
