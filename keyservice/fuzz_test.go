package keyservice

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

// FuzzGetDataKey sends arbitrary requests to the handler: it must answer
// with a key of exactly the requested length or InvalidArgument, never panic.
func FuzzGetDataKey(f *testing.F) {
	f.Add("2b2f6c1e-6f8a-4b8c-9d7e-0a1b2c3d4e5f", uint32(32))
	f.Add("", uint32(0))
	f.Add("../x", uint32(65))
	f.Add("a", uint32(1<<32-1))
	k, err := kms.NewClusterKMS(testSecret, testSalt)
	if err != nil {
		f.Fatal(err)
	}
	srv, err := NewServer(k, slog.New(slog.NewJSONHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id string, length uint32) {
		resp, err := srv.GetDataKey(context.Background(), &keyservicev1.GetDataKeyRequest{DataKeyId: id, Length: length})
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v is not InvalidArgument", err)
			}
			return
		}
		if len(resp.GetDataKey()) != int(length) {
			t.Fatalf("key has %d bytes, want %d", len(resp.GetDataKey()), length)
		}
	})
}
