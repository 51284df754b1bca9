package bootstrapper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// StatusPath is where the bootstrapper reports the node's bootstrap state
// (JSON, see Status), relative to the node's root. It lives under /run, so
// a reboot, which also resets the node lock PCR, clears it.
const StatusPath = "/run/gatehouse/bootstrapper.json"

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

// Status is the content of StatusPath.
type Status struct {
	Phase Phase     `json:"phase"`
	Error string    `json:"error,omitempty"`
	Time  time.Time `json:"time"`
}

// recordStatus records phase (and err, for PhaseFailed) as the node's
// status. The status is a report, not a decision: a failure to write it is
// logged and the bootstrap goes on.
func (m *Machine) recordStatus(phase Phase, err error, now time.Time) {
	if werr := writeStatus(m.Root, phase, err, now); werr != nil {
		m.Log.Warn("Recording the bootstrap status failed", "phase", string(phase), "error", werr.Error())
	}
}

// writeStatus records phase (and err, for PhaseFailed) under root.
func writeStatus(root string, phase Phase, err error, now time.Time) error {
	st := Status{Phase: phase, Time: now.UTC()}
	if err != nil {
		st.Error = err.Error()
	}
	data, merr := json.Marshal(st)
	if merr != nil {
		return merr
	}
	s := &Machine{Root: root}
	return s.writeFile(StatusPath, append(data, '\n'), 0o644)
}

// ReadStatus returns the node's recorded status; a zero Status when none
// was recorded in this boot.
func ReadStatus(root string) (Status, error) {
	data, err := os.ReadFile(filepath.Join(root, StatusPath))
	if errors.Is(err, fs.ErrNotExist) {
		return Status{}, nil
	}
	if err != nil {
		return Status{}, fmt.Errorf("reading bootstrap status: %w", err)
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		return Status{}, fmt.Errorf("reading bootstrap status %s: %w", StatusPath, err)
	}
	return st, nil
}
