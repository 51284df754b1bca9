package tpmattester

import (
	"fmt"
	"io"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// MeasureBoot extends each artefact's digest into its PCR of the SHA-256
// bank of the TPM at rw, in order, and returns the event log (a marshalled
// EventLog) to send with evidence. It checks every artefact before extending
// anything.
func MeasureBoot(rw io.ReadWriter, artefacts []tpm.Artefact) ([]byte, error) {
	log := &attestationv1.EventLog{}
	for _, a := range artefacts {
		if err := tpm.CheckMeasurablePCR(a.PCR); err != nil {
			return nil, fmt.Errorf("measuring %s: %w", a.Description, err)
		}
		log.Events = append(log.Events, &attestationv1.Event{Pcr: uint32(a.PCR), Digest: a.Digest[:], Description: a.Description})
	}
	for _, a := range artefacts {
		if err := tpm2.PCRExtend(rw, tpmutil.Handle(a.PCR), tpm2.AlgSHA256, a.Digest[:], ""); err != nil {
			return nil, fmt.Errorf("extending PCR %d with %s: %w", a.PCR, a.Description, err)
		}
	}
	out, err := proto.Marshal(log)
	if err != nil {
		return nil, fmt.Errorf("encoding event log: %w", err)
	}
	return out, nil
}
