package bootstrapper

import (
	"encoding/json"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/bootstrapstatus"
)

// recordStatus records phase (and err, for PhaseFailed) as the node's
// status. The status is a report, not a decision: a failure to write it is
// logged and the bootstrap goes on.
func (m *Machine) recordStatus(phase bootstrapstatus.Phase, err error, now time.Time) {
	if werr := writeStatus(m.Root, phase, err, now); werr != nil {
		m.Log.Warn("Recording the bootstrap status failed", "phase", string(phase), "error", werr.Error())
	}
}

// writeStatus records phase (and err, for PhaseFailed) under root.
func writeStatus(root string, phase bootstrapstatus.Phase, err error, now time.Time) error {
	st := bootstrapstatus.Status{Phase: phase, Time: now.UTC()}
	if err != nil {
		st.Error = err.Error()
	}
	data, merr := json.Marshal(st)
	if merr != nil {
		return merr
	}
	s := &Machine{Root: root}
	return s.writeFile(bootstrapstatus.Path, append(data, '\n'), 0o644)
}
