package bootstrapper

import (
	"encoding/json"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
)

// StatusPath is where the bootstrapper reports the node's bootstrap state
// (internal/bootstrapstatus).
const StatusPath = bootstrapstatus.Path

// Phase is a node's bootstrap phase.
type Phase = bootstrapstatus.Phase

// Phases of the bootstrapper (docs/bootstrapper.md).
const (
	PhaseWaiting      = bootstrapstatus.PhaseWaiting
	PhaseInitialising = bootstrapstatus.PhaseInitialising
	PhaseJoining      = bootstrapstatus.PhaseJoining
	PhaseRejoining    = bootstrapstatus.PhaseRejoining
	PhaseDone         = bootstrapstatus.PhaseDone
	PhaseFailed       = bootstrapstatus.PhaseFailed
)

// Status is the content of StatusPath.
type Status = bootstrapstatus.Status

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
func ReadStatus(root string) (Status, error) { return bootstrapstatus.Read(root) }
