// Package bootstrapstatus is the node's bootstrap status file: what the
// bootstrapper reports of its progress (docs/bootstrapper.md) and what
// local tooling (`gatehouse mini`) reads of it.
package bootstrapstatus

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Path is where the bootstrapper reports the node's bootstrap state
// (JSON, see Status), relative to the node's root. It lives under /run, so
// a reboot, which also resets the node lock PCR, clears it.
const Path = "/run/gatehouse/bootstrapper.json"

// Phase is a node's bootstrap phase.
type Phase string

// Phases of the bootstrapper (docs/bootstrapper.md).
const (
	PhaseWaiting      Phase = "waiting"      // no lock yet: init or join may come
	PhaseInitialising Phase = "initialising" // the InitServer holds the lock
	PhaseJoining      Phase = "joining"      // the JoinClient holds the lock
	PhaseRejoining    Phase = "rejoining"    // an initialised node after reboot
	PhaseDone         Phase = "done"         // kubeadm succeeded; kubelet runs
	PhaseFailed       Phase = "failed"       // failed after the lock; reset needed
)

// Status is the content of Path.
type Status struct {
	Phase Phase     `json:"phase"`
	Error string    `json:"error,omitempty"`
	Time  time.Time `json:"time"`
}

// Read returns the node's recorded status; a zero Status when none was
// recorded in this boot.
func Read(root string) (Status, error) {
	data, err := os.ReadFile(filepath.Join(root, Path))
	if errors.Is(err, fs.ErrNotExist) {
		return Status{}, nil
	}
	if err != nil {
		return Status{}, fmt.Errorf("reading bootstrap status: %w", err)
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		return Status{}, fmt.Errorf("reading bootstrap status %s: %w", Path, err)
	}
	return st, nil
}
