package keyservice

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"

	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/keyservice/secretstore"
)

// KMSConfig says where the key service's keys come from: either a KMS URI
// file, or a master secret file and a salt file (a mounted Kubernetes Secret).
type KMSConfig struct {
	// URIFile holds a kms:// URI (docs/keys.md).
	URIFile string
	// MasterSecretFile and SaltFile hold the raw master secret and salt.
	MasterSecretFile, SaltFile string
	// Client and Namespace store wrapped DEKs for the pkcs11 backend.
	Client    kubernetes.Interface
	Namespace string
}

// noClose is the closer of a key source that holds nothing to release.
type noClose struct{}

func (noClose) Close() error { return nil }

// OpenKMS builds the key source cfg describes; close the returned closer on
// shutdown.
func OpenKMS(cfg KMSConfig) (keySource, io.Closer, error) {
	switch {
	case cfg.URIFile != "" && (cfg.MasterSecretFile != "" || cfg.SaltFile != ""):
		return nil, nil, errors.New("give either a KMS URI file or master secret and salt files, not both")
	case cfg.URIFile == "" && (cfg.MasterSecretFile == "" || cfg.SaltFile == ""):
		return nil, nil, errors.New("no key source: give a KMS URI file, or both a master secret file and a salt file")
	case cfg.URIFile == "":
		secret, err := os.ReadFile(cfg.MasterSecretFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading master secret: %w", err)
		}
		salt, err := os.ReadFile(cfg.SaltFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading master salt: %w", err)
		}
		k, err := kms.NewClusterKMS(secret, salt)
		return k, noClose{}, err
	}
	data, err := os.ReadFile(cfg.URIFile)
	if err != nil {
		return nil, nil, fmt.Errorf("reading KMS URI: %w", err)
	}
	parsed, err := kms.ParseURI(strings.TrimSpace(string(data)))
	if err != nil {
		return nil, nil, err
	}
	switch u := parsed.(type) {
	case *kms.ClusterKMSURI:
		k, err := kms.NewClusterKMS(u.MasterSecret, u.Salt)
		return k, noClose{}, err
	case *kms.PKCS11URI:
		if cfg.Client == nil || cfg.Namespace == "" {
			return nil, nil, errors.New("the pkcs11 KMS stores wrapped keys in Kubernetes: a client and namespace are needed")
		}
		hsm, kek, err := kms.OpenPKCS11(u)
		if err != nil {
			return nil, nil, err
		}
		return kms.NewPKCS11KMS(kek, secretstore.New(cfg.Client, cfg.Namespace)), hsm, nil
	default:
		return nil, nil, fmt.Errorf("unsupported KMS URI type %T", parsed)
	}
}
