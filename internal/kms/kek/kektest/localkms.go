// Package kektest runs real external KMS servers for tests, on loopback:
// nsmithuk/local-kms (the AWS KMS API) and a Vault server with the Transit
// engine (hack/vault-binary.sh).
package kektest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awskms "github.com/aws/aws-sdk-go-v2/service/kms"
	localkms "github.com/nsmithuk/local-kms/src"
	localkmsconfig "github.com/nsmithuk/local-kms/src/config"
	"github.com/nsmithuk/local-kms/src/data"
	"go.uber.org/goleak"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
)

// IgnoreLocalKMSDrain is the goleak option a package using LocalKMS needs:
// local-kms's LevelDB drains its memory pool for up to a second after it is
// closed.
var IgnoreLocalKMSDrain = goleak.IgnoreTopFunction("github.com/syndtr/goleveldb/leveldb.(*DB).mpoolDrain")

// LocalKMSRegion is the region every LocalKMS serves.
const LocalKMSRegion = "eu-west-2"

// localKMSGlobals sets local-kms's package-level account and region once,
// before any of its servers handles a request.
var localKMSGlobals sync.Once

// LocalKMS is a real AWS KMS API server, nsmithuk/local-kms's request
// handler with its own LevelDB database, on a loopback port. It does not
// check request signatures or IAM policies: tests of refused credentials
// use Vault (VaultServer).
type LocalKMS struct {
	// Endpoint is its URL, for AWSKMSURI.Endpoint.
	Endpoint string
	// Client is an AWS KMS client of it, for a test's administration
	// (CreateKey, DisableKey).
	Client *awskms.Client

	t        testing.TB
	addr     string
	database *data.Database
	mu       sync.Mutex
	server   *http.Server
}

// AWSOptions are the AWS SDK loading options a LocalKMS client needs:
// static test credentials, so the SDK's default chain (the environment,
// ~/.aws, the instance metadata service) is not asked.
func AWSOptions() []func(*config.LoadOptions) error {
	return []func(*config.LoadOptions) error{
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIAGATEHOUSETEST", "test-secret", "")),
		config.WithRegion(LocalKMSRegion),
	}
}

// NewLocalKMS starts a LocalKMS; it stops when the test ends.
func NewLocalKMS(t testing.TB) *LocalKMS {
	t.Helper()
	localKMSGlobals.Do(func() {
		localkmsconfig.AWSAccountId, localkmsconfig.AWSRegion = "111122223333", LocalKMSRegion
	})
	l := &LocalKMS{t: t, database: data.NewDatabase(filepath.Join(t.TempDir(), "local-kms"))}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.addr = lis.Addr().String()
	l.Endpoint = "http://" + l.addr
	l.serve(lis)
	t.Cleanup(func() {
		l.Stop()
		l.database.Close()
	})
	cfg, err := config.LoadDefaultConfig(context.Background(), AWSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	l.Client = awskms.NewFromConfig(cfg, func(o *awskms.Options) { o.BaseEndpoint = aws.String(l.Endpoint) })
	return l
}

func (l *LocalKMS) serve(lis net.Listener) {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			localkms.HandleRequest(w, r, l.database)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	l.mu.Lock()
	l.server = srv
	l.mu.Unlock()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			l.t.Errorf("local-kms: %v", err)
		}
	}()
}

// Stop stops serving (an outage): connections are refused until Start.
func (l *LocalKMS) Stop() {
	l.mu.Lock()
	srv := l.server
	l.server = nil
	l.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Start serves again on the same address, with the same keys.
func (l *LocalKMS) Start() {
	l.t.Helper()
	lis, err := net.Listen("tcp", l.addr)
	if err != nil {
		l.t.Fatal(err)
	}
	l.serve(lis)
}

// CreateKey creates a symmetric key and returns its id.
func (l *LocalKMS) CreateKey() string {
	l.t.Helper()
	out, err := l.Client.CreateKey(context.Background(), &awskms.CreateKeyInput{})
	if err != nil {
		l.t.Fatalf("local-kms CreateKey: %v", err)
	}
	return *out.KeyMetadata.KeyId
}

// URI returns the KEK URI of key id on l (no wrapped secret).
func (l *LocalKMS) URI(keyID string) *kms.AWSKMSURI {
	return &kms.AWSKMSURI{KeyID: keyID, Region: LocalKMSRegion, Endpoint: l.Endpoint}
}

// SetKeyEnabled enables or disables key id.
func (l *LocalKMS) SetKeyEnabled(keyID string, enabled bool) {
	l.t.Helper()
	var err error
	if enabled {
		_, err = l.Client.EnableKey(context.Background(), &awskms.EnableKeyInput{KeyId: &keyID})
	} else {
		_, err = l.Client.DisableKey(context.Background(), &awskms.DisableKeyInput{KeyId: &keyID})
	}
	if err != nil {
		l.t.Fatalf("local-kms enable=%v %s: %v", enabled, keyID, err)
	}
}
