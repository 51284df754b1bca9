package joinservice

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	keyservicev1 "github.com/gatehouse-dev/gatehouse/api/keyservice/v1"
	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/grpcopts"
)

// ServerCredentials returns the service's attested TLS credentials: joiners
// must attest and are appraised by the join config in force in policies
// (liveVerifier); the service presents its identity.
func ServerCredentials(policies *PolicyStore, identity *clusterpki.Identity, now func() time.Time) (*atls.Credentials, error) {
	return atls.NewCredentials(atls.Config{Verifiers: []attestation.Verifier{liveVerifier{store: policies}}, Certificate: identity.Certificate, Now: now})
}

// DialKeyService returns a connection to the key service at endpoint
// (host:port) over mutual TLS with tlsCfg (KeyServiceTLSConfig), with
// grpcopts' transport settings, as the key service serves them.
func DialKeyService(endpoint string, tlsCfg *tls.Config) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(endpoint, append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
	}, grpcopts.Dial()...)...)
	if err != nil {
		return nil, fmt.Errorf("key service %s: %w", endpoint, err)
	}
	return conn, nil
}

// KeyServiceKeys adapts a key service connection (mutual TLS) to the keys
// the join service needs.
type KeyServiceKeys struct {
	client keyservicev1.KeyServiceClient
}

// NewKeyServiceKeys returns keys fetched over conn.
func NewKeyServiceKeys(conn grpc.ClientConnInterface) *KeyServiceKeys {
	return &KeyServiceKeys{client: keyservicev1.NewKeyServiceClient(conn)}
}

// GetDataKey returns the key service's data key for id, length bytes.
func (k *KeyServiceKeys) GetDataKey(ctx context.Context, id string, length int) ([]byte, error) {
	resp, err := k.client.GetDataKey(ctx, &keyservicev1.GetDataKeyRequest{DataKeyId: id, Length: uint32(length)})
	if err != nil {
		return nil, err
	}
	if len(resp.GetDataKey()) != length {
		return nil, fmt.Errorf("key service returned %d bytes, asked for %d", len(resp.GetDataKey()), length)
	}
	return resp.GetDataKey(), nil
}
