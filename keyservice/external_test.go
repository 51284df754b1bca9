package keyservice

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek/kektest"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

var discardLog = slog.New(slog.DiscardHandler)

// gaugeValue is the value of the unlabelled gauge name in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// TestExternalKMSKeyService runs the key service over mutual TLS with its
// master secret wrapped by a real AWS KMS API server (local-kms): keys
// while the KMS answers, Unavailable with the reason while it is down or
// the key is disabled (and back after), a re-wrap under another key with
// the old one disabled without a single failed request, a start while the
// KMS is down, and no secret in any log, error or file.
func TestExternalKMSKeyService(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := kektest.NewLocalKMS(t)
	keyA, keyB := l.CreateKey(), l.CreateKey()
	secret, salt := make([]byte, 32), make([]byte, 32)
	_, _ = rand.Read(secret)
	_, _ = rand.Read(salt)
	wrapped, err := kek.WrapNew(ctx, l.URI(keyA).String(), secret, salt, kektest.AWSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	uriFile := filepath.Join(dir, "kms-uri")
	if err := atomicfile.Write(uriFile, []byte(wrapped+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reference, _ := kms.NewClusterKMS(secret, salt)
	want, _ := reference.GetDataKey(ctx, "measurementSecret", 32)

	logs := &testkit.LogBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	open := func(t *testing.T) (*kms.WrappedKMS, *prometheus.Registry) {
		t.Helper()
		reg := prometheus.NewRegistry()
		// Checks run when the test says (Check); the loop's are an hour apart.
		keys, closer, err := OpenKMS(ctx, KMSConfig{URIFile: uriFile, CheckInterval: time.Hour, AWSOptions: kektest.AWSOptions()}, log, reg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = closer.Close() })
		return keys.(*kms.WrappedKMS), reg
	}
	w, reg := open(t)
	h := newHarnessLogging(t, w, logs, slog.LevelDebug)
	js := h.joinService(t)
	get := func() ([]byte, error) {
		resp, err := js.GetDataKey(ctx, &keyservicev1.GetDataKeyRequest{DataKeyId: "measurementSecret", Length: 32})
		return resp.GetDataKey(), err
	}
	serves := func(t *testing.T) {
		t.Helper()
		if err := w.Check(ctx); err != nil {
			t.Fatalf("check: %v", err)
		}
		if got, err := get(); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("GetDataKey: %v, or the key is not the master secret's", err)
		}
	}
	refuses := func(t *testing.T, reason string) {
		t.Helper()
		checkCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = w.Check(checkCtx)
		_, err := get()
		if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), reason) {
			t.Fatalf("GetDataKey error = %v, want Unavailable naming %q", err, reason)
		}
		if v := gaugeValue(t, reg, "gatehouse_keyservice_kms_available"); v != 0 {
			t.Fatalf("gatehouse_keyservice_kms_available = %v while the KMS refuses", v)
		}
	}

	serves(t)
	if v := gaugeValue(t, reg, "gatehouse_keyservice_kms_available"); v != 1 {
		t.Fatalf("gatehouse_keyservice_kms_available = %v, want 1", v)
	}
	t.Run("key disabled", func(t *testing.T) {
		l.SetKeyEnabled(keyA, false)
		defer l.SetKeyEnabled(keyA, true)
		refuses(t, "DisabledException")
		l.SetKeyEnabled(keyA, true)
		serves(t)
	})
	t.Run("KMS down", func(t *testing.T) {
		l.Stop()
		refuses(t, "connection refused")
		l.Start()
		serves(t)
	})
	t.Run("re-wrapped under another key while serving", func(t *testing.T) {
		var failed, served atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if got, err := get(); err != nil || !bytes.Equal(got, want) {
					failed.Add(1)
				} else {
					served.Add(1)
				}
			}
		}()
		moved, err := kek.Rewrap(ctx, wrapped, l.URI(keyB).String(), kektest.AWSOptions()...)
		if err == nil {
			err = atomicfile.Write(uriFile, []byte(moved+"\n"), 0o600)
		}
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
		l.SetKeyEnabled(keyA, false)
		checkErr := w.Check(ctx)
		// Some requests after the check, so the re-wrapped URI served them.
		after, deadline := served.Load(), time.Now().Add(time.Minute)
		for served.Load() < after+20 && failed.Load() == 0 && time.Now().Before(deadline) {
			runtime.Gosched()
		}
		close(stop)
		wg.Wait()
		if checkErr != nil {
			t.Fatalf("check after the re-wrap: %v", checkErr)
		}
		if failed.Load() != 0 {
			t.Fatalf("%d of %d requests failed during the re-wrap", failed.Load(), failed.Load()+served.Load())
		}
		t.Logf("%d requests served during the re-wrap, none failed", served.Load())
		if leaks := strings.Contains(moved, string(secret)); leaks {
			t.Fatal("the re-wrapped URI carries the secret")
		}
	})
	t.Run("started while the KMS is down", func(t *testing.T) {
		l.Stop()
		restarted, _ := open(t)
		if _, err := restarted.GetDataKey(ctx, "measurementSecret", 32); err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("GetDataKey error = %v, want one naming the refused connection", err)
		}
		l.Start()
		if err := restarted.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := restarted.GetDataKey(ctx, "measurementSecret", 32); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("after the KMS came back: %v", err)
		}
	})
	testkit.AssertNoSecrets(t, logs.String(), [][]byte{secret, want})
	for _, line := range []string{"External KMS check failed", "DisabledException", "Master secret unwrapped"} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("the logs do not say %q", line)
		}
	}
}
