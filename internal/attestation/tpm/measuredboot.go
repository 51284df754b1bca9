package tpm

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// Artefact is one thing a measured boot measures: its SHA-256 digest is
// extended into PCR.
type Artefact struct {
	// PCR to extend: 0-15, 16 or 23, the PCRs that start at zero.
	PCR int
	// Description says what was measured; it goes into the event log.
	Description string
	// Digest is the SHA-256 digest of the artefact.
	Digest [sha256.Size]byte
}

// BytesArtefact measures data, e.g. a configuration file's contents.
func BytesArtefact(pcr int, description string, data []byte) Artefact {
	return Artefact{PCR: pcr, Description: description, Digest: sha256.Sum256(data)}
}

// FileArtefact measures the file at path, described as "file:<path>".
func FileArtefact(pcr int, path string) (Artefact, error) {
	f, err := os.Open(path)
	if err != nil {
		return Artefact{}, fmt.Errorf("measuring %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return Artefact{}, fmt.Errorf("measuring %s: %w", path, err)
	}
	a := Artefact{PCR: pcr, Description: "file:" + path}
	copy(a.Digest[:], h.Sum(nil))
	return a, nil
}

// CheckMeasurablePCR returns an error unless pcr is one a measured boot may
// extend: 0-16 or 23, the PCRs that start at zero on a TPM reset (TCG PC
// Client Platform Firmware Profile, §3.3.4).
func CheckMeasurablePCR(pcr int) error {
	if (pcr >= 0 && pcr <= 16) || pcr == 23 {
		return nil
	}
	return fmt.Errorf("PCR %d cannot be measured into: use 0-16 or 23, the PCRs that start at zero", pcr)
}

// ExpectedPCRs computes, without a TPM, the SHA-256 PCR values a measured
// boot of artefacts produces on a freshly started TPM, for the PCRs in pcrs
// (PCRs without artefacts stay all zero). It is how reference values for a
// node image are generated.
func ExpectedPCRs(artefacts []Artefact, pcrs []int) (map[uint32][]byte, error) {
	values := make(map[uint32][]byte, len(pcrs))
	for _, pcr := range pcrs {
		if err := CheckMeasurablePCR(pcr); err != nil {
			return nil, err
		}
		values[uint32(pcr)] = make([]byte, sha256.Size)
	}
	for _, a := range artefacts {
		if err := CheckMeasurablePCR(a.PCR); err != nil {
			return nil, fmt.Errorf("measuring %s: %w", a.Description, err)
		}
		if v, ok := values[uint32(a.PCR)]; ok {
			values[uint32(a.PCR)] = extend(v, a.Digest[:])
		}
	}
	return values, nil
}

// ReferenceValues returns ExpectedPCRs as enforced reference values.
func ReferenceValues(artefacts []Artefact, pcrs []int) (measurements.M, error) {
	values, err := ExpectedPCRs(artefacts, pcrs)
	if err != nil {
		return nil, err
	}
	m := make(measurements.M, len(values))
	for index, v := range values {
		m[index] = measurements.Measurement{Expected: v}
	}
	return m, nil
}

// extend returns SHA-256(old || digest), a PCR extension (Part 1 §17.2).
func extend(old, digest []byte) []byte {
	h := sha256.New()
	h.Write(old)
	h.Write(digest)
	return h.Sum(nil)
}

// ReplayedPCRs replays a marshalled EventLog from all-zero PCRs and returns
// the SHA-256 value each PCR it touches ends at (32 bytes each). Errors
// wrap attestation.ErrMalformed.
func ReplayedPCRs(data []byte) (map[uint32][]byte, error) {
	log, err := parseEventLog(data)
	if err != nil {
		return nil, err
	}
	replayed := map[uint32][]byte{}
	for _, e := range log.GetEvents() {
		old, ok := replayed[e.GetPcr()]
		if !ok {
			old = make([]byte, sha256.Size)
		}
		replayed[e.GetPcr()] = extend(old, e.GetDigest())
	}
	return replayed, nil
}

// parseEventLog decodes a marshalled EventLog, checking every event.
func parseEventLog(data []byte) (*attestationv1.EventLog, error) {
	if len(data) > attestation.MaxEvidenceSize {
		return nil, fmt.Errorf("%w: event log has %d bytes", attestation.ErrMalformed, len(data))
	}
	log := &attestationv1.EventLog{}
	if err := proto.Unmarshal(data, log); err != nil {
		return nil, fmt.Errorf("%w: decoding event log: %w", attestation.ErrMalformed, err)
	}
	for i, e := range log.GetEvents() {
		if err := CheckMeasurablePCR(int(e.GetPcr())); err != nil {
			return nil, fmt.Errorf("%w: event %d: %w", attestation.ErrMalformed, i, err)
		}
		if len(e.GetDigest()) != sha256.Size {
			return nil, fmt.Errorf("%w: event %d: digest has %d bytes, want %d", attestation.ErrMalformed, i, len(e.GetDigest()), sha256.Size)
		}
	}
	return log, nil
}

// replayEventLog replays a marshalled EventLog from all-zero PCRs and checks
// that every PCR it touches and pcrs reports ends at the reported value.
func replayEventLog(data []byte, pcrs map[uint32][]byte) error {
	replayed, err := ReplayedPCRs(data)
	if err != nil {
		return err
	}
	for pcr, value := range replayed {
		if got, ok := pcrs[pcr]; ok && !bytes.Equal(got, value) {
			return fmt.Errorf("%w: event log does not replay to the value of PCR %d", attestation.ErrPolicy, pcr)
		}
	}
	return nil
}
