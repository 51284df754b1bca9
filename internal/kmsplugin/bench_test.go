package kmsplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
)

// BenchmarkSecretCreate measures Secret creates on a real API server and
// etcd without encryption at rest and with the KMS v2 plugin, side by side
// in one run (bench/encryption.sh, docs/benchmarks.md): each op is one
// Secret create of a 1 KiB value, 16 callers at once, against an API
// server of its own per variant (started outside the timing).
func BenchmarkSecretCreate(b *testing.B) {
	for _, encrypted := range []bool{false, true} {
		name := "identity"
		if encrypted {
			name = "kms-v2"
		}
		b.Run(name, func(b *testing.B) {
			var args []string
			if encrypted {
				dir, err := os.MkdirTemp("", "gh-kms")
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = os.RemoveAll(dir) })
				socket := filepath.Join(dir, "kms-v2.sock")
				config, err := kubeadm.EncryptionConfiguration(socket)
				if err != nil {
					b.Fatal(err)
				}
				configFile := filepath.Join(dir, "encryption-config.yaml")
				if err := os.WriteFile(configFile, config, 0o600); err != nil {
					b.Fatal(err)
				}
				servePlugin(b, socket, clusterKMS(b), 1, 1)
				args = []string{"--encryption-provider-config=" + configFile}
			}
			env := testenv.New(b, testenv.Options{APIServerArgs: args})
			cfg := *env.Config
			cfg.QPS, cfg.Burst = -1, 0 // no client-side rate limit
			client, err := kubernetes.NewForConfig(&cfg)
			if err != nil {
				b.Fatal(err)
			}
			value := make([]byte, 1024)
			var next atomic.Int64
			create := func() error {
				name := fmt.Sprintf("s-%d", next.Add(1))
				_, err := client.CoreV1().Secrets("default").Create(context.Background(),
					&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string][]byte{"v": value}}, metav1.CreateOptions{})
				return err
			}
			// Warm: the first create makes the DEK (one plugin call).
			if err := create(); err != nil {
				b.Fatal(err)
			}
			const callers = 16
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			var failed atomic.Int64
			var remaining atomic.Int64
			remaining.Store(int64(b.N))
			for range callers {
				wg.Go(func() {
					for remaining.Add(-1) >= 0 {
						if create() != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "creates/s")
			if failed.Load() > 0 {
				b.Fatalf("%d creates failed", failed.Load())
			}
		})
	}
}
