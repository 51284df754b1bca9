package clusterconfig

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek"
)

// Files `gatehouse init` writes by default, in the current directory.
const (
	DefaultMasterSecretFile = "gatehouse-master-secret.json"
	DefaultStateFile        = "gatehouse-state.json"
	DefaultKubeconfig       = "gatehouse-admin.conf"
)

// State is the CLI's record of a cluster (gatehouse-state.json).
type State struct {
	// Phase is "initialising" while an init may be resumed, then "initialised".
	Phase string `json:"phase"`
	// Node is the first control plane's InitService address.
	Node string `json:"node"`
	// MeasurementSalt is the cluster's measurement salt (hex).
	MeasurementSalt string `json:"measurementSalt"`
	// ClusterID is the cluster ID (hex), once initialised.
	ClusterID string `json:"clusterID,omitempty"`
	// KubernetesVersion the cluster was initialised with.
	KubernetesVersion string `json:"kubernetesVersion"`
}

// ReadState reads a state file; a missing file is an error satisfying
// errors.Is(err, fs.ErrNotExist).
func ReadState(path string) (*State, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}

// WriteState writes a state file atomically, mode 0600.
func WriteState(path string, s *State) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding state file %s: %w", path, err)
	}
	return atomicfile.Write(path, append(data, '\n'), 0o600)
}

// MasterSecret is the master secret file `gatehouse init` writes
// (DefaultMasterSecretFile, mode 0600): the cluster's master secret and
// salt, 32 bytes each, from which every key is derived (docs/keys.md), or,
// when the cluster configuration names a masterSecretKEK, only the external
// KMS URI carrying the wrapped secret (docs/keys.md, "External KMS"). A
// plain file's bytes are secret; errors reading it never quote them.
type MasterSecret struct {
	Key  []byte `json:"key,omitempty"`
	Salt []byte `json:"salt,omitempty"`
	// KMS is the kms://aws-kms or kms://vault-transit URI carrying the
	// wrapped master secret and salt; Key and Salt are then empty.
	KMS string `json:"kms,omitempty"`
}

// ReadMasterSecret reads the master secret file at path: either a plain
// secret (key and salt) or a wrapped one (kms).
func ReadMasterSecret(path string) (*MasterSecret, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the master secret: %w", err)
	}
	var secret MasterSecret
	if err := json.Unmarshal(data, &secret); err != nil || (secret.KMS == "") == (len(secret.Key) == 0) {
		return nil, fmt.Errorf("%s: not a master secret file (JSON with key and salt, or kms)", path)
	}
	return &secret, nil
}

// Unwrapped returns the plain master secret: s itself, or the secret its
// external KMS unwraps (which needs the KMS's credentials here).
func (s *MasterSecret) Unwrapped(ctx context.Context) (*MasterSecret, error) {
	if s.KMS == "" {
		return s, nil
	}
	key, salt, err := kek.UnwrapURI(ctx, s.KMS)
	if err != nil {
		return nil, fmt.Errorf("unwrapping the master secret with its KMS: %w", err)
	}
	return &MasterSecret{Key: key, Salt: salt}, nil
}

// KeyServiceURI is the KMS URI the key service is given: the wrapped
// secret's URI, or a cluster-kms URI of the plain one.
func (s *MasterSecret) KeyServiceURI() string {
	if s.KMS != "" {
		return s.KMS
	}
	return kms.ClusterKMSURIString(s.Key, s.Salt)
}
