package keyservice

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// BenchmarkKeyService compares, in one run and over one mutual-TLS gRPC
// connection on loopback, GetDataKey with a no-op RPC (a test-only method
// on the same server that decodes an empty message and returns one: the
// transport's limit), for 1 and 64 concurrent callers, and in-process HKDF
// derivation.
func BenchmarkKeyService(b *testing.B) {
	// Logs at the production default level (info), formatted and dropped.
	h := newHarnessLogging(b, nil, &testkit.LogBuffer{Discard: true}, slog.LevelInfo)
	cert := h.ca.Issue(b, "gatehouse-joinservice", false)
	conn := h.dial(b, &cert)
	keys := keyservicev1.NewKeyServiceClient(conn)
	ctx := context.Background()
	req := &keyservicev1.GetDataKeyRequest{DataKeyId: "2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", Length: 32}
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("GetDataKey/callers=%d", callers), func(b *testing.B) {
			runCallers(b, callers, func() error { _, err := keys.GetDataKey(ctx, req); return err })
		})
		b.Run(fmt.Sprintf("noop-rpc/callers=%d", callers), func(b *testing.B) {
			runCallers(b, callers, func() error {
				return conn.Invoke(ctx, "/gatehouse.test.Noop/Noop", &emptypb.Empty{}, &emptypb.Empty{})
			})
		})
	}
	b.Run("in-process-hkdf", func(b *testing.B) {
		k, err := kms.NewClusterKMS(testSecret, testSalt)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := k.GetDataKey(ctx, req.GetDataKeyId(), 32); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// runCallers runs b.N calls of call spread over exactly n goroutines.
func runCallers(b *testing.B, n int, call func() error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	b.ResetTimer()
	for range n {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := call(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
