package keyservice

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/connlimit"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// countingKeys counts the keys the backend derives.
type countingKeys struct {
	keySource
	derived atomic.Int64
}

func (c *countingKeys) GetDataKey(ctx context.Context, id string, length int) ([]byte, error) {
	c.derived.Add(1)
	return c.keySource.GetDataKey(ctx, id, length)
}

// TestKeyServiceAttacks: requests the key service must refuse before its
// backend derives anything (refused handshakes are in
// TestUnauthenticatedCallersAreRefused).
func TestKeyServiceAttacks(t *testing.T) {
	backend, err := kms.NewClusterKMS(testSecret, testSalt)
	if err != nil {
		t.Fatal(err)
	}
	keys := &countingKeys{keySource: backend}
	h := startHarness(t, keys, &testkit.LogBuffer{}, slog.LevelDebug,
		connlimit.Limits{Handshakes: connlimit.Rate{Rate: 0.001, Burst: 2}})

	t.Run("request with fields the service does not know", func(t *testing.T) {
		raw, err := proto.Marshal(&keyservicev1.GetDataKeyRequest{DataKeyId: "measurementSecret", Length: 32})
		if err != nil {
			t.Fatal(err)
		}
		req := &keyservicev1.GetDataKeyRequest{}
		if err := proto.Unmarshal(protowire.AppendVarint(protowire.AppendTag(raw, 50, protowire.VarintType), 1), req); err != nil {
			t.Fatal(err)
		}
		_, err = h.joinService(t).GetDataKey(t.Context(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("got %v, want InvalidArgument", err)
		}
		if n := keys.derived.Load(); n != 0 {
			t.Fatalf("the backend derived %d keys for a refused request", n)
		}
	})

	t.Run("connection flood from one source", func(t *testing.T) {
		// The first subtest used one of the two connections the source may open.
		client := h.joinService(t)
		if _, err := client.GetDataKey(t.Context(), &keyservicev1.GetDataKeyRequest{DataKeyId: "a", Length: 32}); err != nil {
			t.Fatalf("second connection: %v", err)
		}
		_, err := h.joinService(t).GetDataKey(t.Context(), &keyservicev1.GetDataKeyRequest{DataKeyId: "a", Length: 32})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("third connection: %v, want it closed before the handshake", err)
		}
		if got := testutil.ToFloat64(h.srv.metrics.handshakes.WithLabelValues("refused", connlimit.ReasonRate)); got < 1 {
			t.Errorf("handshakes_total{refused,%s} = %v, want at least 1", connlimit.ReasonRate, got)
		}
		if n := keys.derived.Load(); n != 1 {
			t.Errorf("the backend derived %d keys, want 1 (the allowed request)", n)
		}
	})
	testkit.AssertNoSecrets(t, h.logs.String(), [][]byte{testSecret, testSalt})
}
