package clusterconfig

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
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
// salt, 32 bytes each, from which every key is derived (docs/keys.md).
// Its bytes are secret; errors reading it never quote them.
type MasterSecret struct {
	Key  []byte `json:"key"`
	Salt []byte `json:"salt"`
}

// ReadMasterSecret reads the master secret file at path.
func ReadMasterSecret(path string) (*MasterSecret, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the master secret: %w", err)
	}
	var secret MasterSecret
	if err := json.Unmarshal(data, &secret); err != nil {
		return nil, fmt.Errorf("%s: not a master secret file (JSON with key and salt)", path)
	}
	return &secret, nil
}
