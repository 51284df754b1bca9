// Package kmsplugin is the key service's Kubernetes KMS v2 plugin: the API
// server encrypts each resource with a data-encryption key (DEK) of its
// own and asks the plugin, over a Unix socket, to encrypt that DEK
// (envelope encryption; Kubernetes docs, "Using a KMS provider for data
// encryption", KMS v2). The plugin's key-encryption key (KEK) of generation
// g is derived from the master secret under keys.EtcdEncryptionKeyID(g), so
// every control plane's key service has the same KEKs without storing any.
package kmsplugin

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	kmsapi "k8s.io/kms/apis/v2"
	"k8s.io/kms/pkg/service"

	"google.golang.org/grpc"

	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// keySource returns data keys; declared here, where it is used.
type keySource interface {
	GetDataKey(ctx context.Context, id string, length int) ([]byte, error)
}

// keyIDPrefix starts every key ID the plugin reports; the generation
// follows.
const keyIDPrefix = "gatehouse-etcd-v"

// KeyID is the KMS v2 key ID of KEK generation g, as the API server stores
// it beside each encrypted DEK: "gatehouse-etcd-v<g>".
func KeyID(g int) string { return keyIDPrefix + strconv.Itoa(g) }

// Plugin implements k8s.io/kms's service.Service. Encrypt uses generation
// Current; Decrypt accepts generations Oldest to Current, so after a
// rotation (Current+1) the API server still reads what the previous KEK
// encrypted until it is rewritten, and raising Oldest retires a KEK.
type Plugin struct {
	keys            keySource
	current, oldest int
	log             *slog.Logger
}

// New returns a plugin over keys with KEK generations oldest..current
// (1 ≤ oldest ≤ current).
func New(keys keySource, current, oldest int, log *slog.Logger) (*Plugin, error) {
	if oldest < 1 || current < oldest {
		return nil, fmt.Errorf("KEK generations: want 1 ≤ oldest (%d) ≤ current (%d)", oldest, current)
	}
	return &Plugin{keys: keys, current: current, oldest: oldest, log: log}, nil
}

func (p *Plugin) aead(ctx context.Context, g int) (cipher.AEAD, error) {
	key, err := p.keys.GetDataKey(ctx, keys.EtcdEncryptionKeyID(g), keys.EtcdEncryptionKeySize)
	if err != nil {
		return nil, fmt.Errorf("deriving KEK generation %d: %w", g, err)
	}
	block, err := aes.NewCipher(key)
	clear(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Encrypt encrypts a DEK with the current KEK: AES-256-GCM, a random
// 96-bit nonce, the key ID as additional data; the ciphertext is
// nonce ‖ sealed DEK.
func (p *Plugin) Encrypt(ctx context.Context, uid string, data []byte) (*service.EncryptResponse, error) {
	aead, err := p.aead(ctx, p.current)
	if err != nil {
		p.log.Error("KMS v2 encrypt failed", slog.String("uid", uid), slog.String("error", err.Error()))
		return nil, err
	}
	id := KeyID(p.current)
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return &service.EncryptResponse{Ciphertext: aead.Seal(nonce, nonce, data, []byte(id)), KeyID: id}, nil
}

// Decrypt decrypts a DEK the plugin encrypted with the KEK req.KeyID
// names; a key ID of a retired, future or foreign generation, or a
// ciphertext that does not open, is an error.
func (p *Plugin) Decrypt(ctx context.Context, uid string, req *service.DecryptRequest) ([]byte, error) {
	g, err := p.generation(req.KeyID)
	if err != nil {
		p.log.Error("KMS v2 decrypt refused", slog.String("uid", uid), slog.String("keyID", req.KeyID), slog.String("error", err.Error()))
		return nil, err
	}
	aead, err := p.aead(ctx, g)
	if err != nil {
		p.log.Error("KMS v2 decrypt failed", slog.String("uid", uid), slog.String("error", err.Error()))
		return nil, err
	}
	if len(req.Ciphertext) < aead.NonceSize()+aead.Overhead() {
		return nil, errors.New("ciphertext too short")
	}
	n := aead.NonceSize()
	dek, err := aead.Open(nil, req.Ciphertext[:n], req.Ciphertext[n:], []byte(req.KeyID))
	if err != nil {
		p.log.Error("KMS v2 decrypt failed: the ciphertext does not open with its KEK", slog.String("uid", uid), slog.String("keyID", req.KeyID))
		return nil, fmt.Errorf("decrypting the DEK with KEK %s: %w", req.KeyID, err)
	}
	return dek, nil
}

func (p *Plugin) generation(keyID string) (int, error) {
	digits, ok := strings.CutPrefix(keyID, keyIDPrefix)
	g, err := strconv.Atoi(digits)
	switch {
	case !ok || err != nil || strconv.Itoa(g) != digits:
		return 0, fmt.Errorf("key ID %q is not one of this plugin's (%s<generation>)", keyID, keyIDPrefix)
	case g < p.oldest:
		return 0, fmt.Errorf("KEK %s is retired (oldest generation %d): rewrite the resources it encrypted before raising the oldest generation", keyID, p.oldest)
	case g > p.current:
		return 0, fmt.Errorf("KEK %s is newer than this plugin's current generation %d", keyID, p.current)
	}
	return g, nil
}

// Status reports healthy, with the current key ID, while the current KEK
// can be derived (an external KMS unwrapped the master secret).
func (p *Plugin) Status(ctx context.Context) (*service.StatusResponse, error) {
	if _, err := p.aead(ctx, p.current); err != nil {
		return nil, err
	}
	return &service.StatusResponse{Version: "v2", Healthz: "ok", KeyID: KeyID(p.current)}, nil
}

// Serve serves plugin on the Unix socket path (created mode 0600, a stale
// one replaced) until ctx ends.
func Serve(ctx context.Context, path string, plugin service.Service) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("creating the KMS plugin socket's directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing a stale KMS plugin socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on the KMS plugin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = lis.Close()
		return err
	}
	srv := grpc.NewServer(grpc.ConnectionTimeout(10 * time.Second))
	kmsapi.RegisterKeyManagementServiceServer(srv, service.NewGRPCService(path, 10*time.Second, plugin))
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving the KMS plugin: %w", err)
	}
	return nil
}
