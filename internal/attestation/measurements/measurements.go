// Package measurements holds reference values (RFC 9334 §3.3): the
// measurements a verifier expects, by index, and the comparison of reported
// measurements against them.
//
// What an index means depends on the attestation variant:
//
//	tpm      index = PCR number (0-23), value = SHA-256 PCR value (32 bytes)
//	sev-snp  index 0 = launch MEASUREMENT (48 bytes)
//	tdx      index 0 = MRTD, 1-4 = RTMR0-RTMR3 (48 bytes each)
//
// The file format is YAML or JSON, a map from index to reference value:
//
//	4:  {expected: "9f86d0…", warnOnly: false}
//	15: {expected: "0000…", warnOnly: false}
//	8:  {expected: "ab12…", alsoAccepted: ["cd34…"]}
//
// alsoAccepted lists further values accepted at an index: the old and the
// new image during a rolling upgrade, or one node's measurement an
// administrator accepted.
//
// events (tpm only, optional) lists the events expected behind Expected, in
// the order they are extended, so that a verifier replaying the node's TCG
// event log can name the event that differs (docs/attestation.md, "Event
// logs"):
//
//	11: {expected: "…", events: [{type: EV_IPL, description: ".cmdline", digest: "…", source: "uki.efi section .cmdline"}]}
//
// Parsing is strict: unknown fields, non-hex values, and indices that are not
// decimal integers are errors naming the index.
package measurements

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// maxFileSize bounds a reference-values file in bytes.
const maxFileSize = 1 << 20

// Measurement is the reference value of one index.
type Measurement struct {
	// Expected is the expected value.
	Expected []byte
	// WarnOnly makes a mismatch a warning instead of a failure.
	WarnOnly bool
	// AlsoAccepted are further accepted values.
	AlsoAccepted [][]byte
	// Events are the events expected behind Expected, in extension order;
	// nil when the reference value comes without them.
	Events []Event
}

// Event is one measurement event expected behind a reference value: what a
// TCG event log entry (TCG PC Client Platform Firmware Profile §10.2) is
// expected to hold, and where the expectation came from.
type Event struct {
	// Type is the TCG event type's name, e.g. "EV_IPL" or
	// "EV_EFI_BOOT_SERVICES_APPLICATION".
	Type string `json:"type"`
	// Description says what was measured, e.g. ".cmdline".
	Description string `json:"description"`
	// Digest is the SHA-256 digest extended into the PCR (32 bytes).
	Digest []byte `json:"digest"`
	// Source is the provenance of Digest, e.g. "uki.efi section .cmdline".
	Source string `json:"source,omitempty"`
}

// wireEvent is the file form of an Event.
type wireEvent struct {
	Type        string `json:"type"`
	Description string `json:"description"`
	Digest      string `json:"digest"`
	Source      string `json:"source,omitempty"`
}

// Accepts reports whether v is Expected or one of AlsoAccepted.
func (m Measurement) Accepts(v []byte) bool {
	return bytes.Equal(v, m.Expected) || slices.ContainsFunc(m.AlsoAccepted, func(a []byte) bool { return bytes.Equal(v, a) })
}

// Values returns Expected and AlsoAccepted.
func (m Measurement) Values() [][]byte { return append([][]byte{m.Expected}, m.AlsoAccepted...) }

// M maps an index to its reference value.
type M map[uint32]Measurement

// wireMeasurement is the file form of a Measurement.
type wireMeasurement struct {
	Expected     *string     `json:"expected"`
	WarnOnly     bool        `json:"warnOnly"`
	AlsoAccepted []string    `json:"alsoAccepted"`
	Events       []wireEvent `json:"events"`
}

// fieldNames are the only field names of wireMeasurement, matched exactly
// (encoding/json alone would match them case-insensitively).
var fieldNames = []string{"expected", "warnOnly", "alsoAccepted", "events"}

// Parse reads reference values from YAML or JSON. Every value must have
// valueSize bytes (32 for tpm, 48 for sev-snp and tdx); 0 accepts any
// non-empty size.
func Parse(data []byte, valueSize int) (M, error) {
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("reference values: file has %d bytes, at most %d allowed", len(data), maxFileSize)
	}
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("reference values: %w", err)
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(jsonData, &raw); err != nil {
		return nil, fmt.Errorf("reference values: want a map of index to {expected: hex, warnOnly: bool}: %w", err)
	}
	if len(raw) == 0 {
		return nil, errors.New("reference values: none given; expect at least one index")
	}
	m := make(M, len(raw))
	for key, fields := range raw {
		index, err := strconv.ParseUint(key, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("reference values: index %q is not a decimal integer", key)
		}
		for name := range fields {
			if !slices.Contains(fieldNames, name) {
				return nil, fmt.Errorf("reference values: index %d: unknown field %q (known: expected, warnOnly, alsoAccepted, events)", index, name)
			}
		}
		var w wireMeasurement
		if err := reencode(fields, &w); err != nil {
			return nil, fmt.Errorf("reference values: index %d: %w", index, err)
		}
		if w.Expected == nil {
			return nil, fmt.Errorf("reference values: index %d has no expected value", index)
		}
		var values [][]byte
		for i, text := range append([]string{*w.Expected}, w.AlsoAccepted...) {
			what := "expected value"
			if i > 0 {
				what = fmt.Sprintf("alsoAccepted[%d]", i-1)
			}
			value, err := hex.DecodeString(text)
			if err != nil {
				return nil, fmt.Errorf("reference values: index %d: %s is not hex: %w", index, what, err)
			}
			if len(value) == 0 || (valueSize != 0 && len(value) != valueSize) {
				return nil, fmt.Errorf("reference values: index %d: %s has %d bytes, want %d", index, what, len(value), valueSize)
			}
			values = append(values, value)
		}
		events, err := parseEvents(w.Events)
		if err != nil {
			return nil, fmt.Errorf("reference values: index %d: %w", index, err)
		}
		m[uint32(index)] = Measurement{Expected: values[0], WarnOnly: w.WarnOnly, AlsoAccepted: values[1:], Events: events}
	}
	return m, nil
}

// parseEvents decodes the events of one index: every one needs a type and
// a 32-byte hex digest.
func parseEvents(wire []wireEvent) ([]Event, error) {
	if len(wire) == 0 {
		return nil, nil
	}
	events := make([]Event, len(wire))
	for i, w := range wire {
		if w.Type == "" {
			return nil, fmt.Errorf("events[%d] has no type (a TCG event type such as EV_IPL)", i)
		}
		digest, err := hex.DecodeString(w.Digest)
		if err != nil {
			return nil, fmt.Errorf("events[%d] (%s %q): digest is not hex: %w", i, w.Type, w.Description, err)
		}
		if len(digest) != sha256.Size {
			return nil, fmt.Errorf("events[%d] (%s %q): digest has %d bytes, want %d (SHA-256)", i, w.Type, w.Description, len(digest), sha256.Size)
		}
		events[i] = Event{Type: w.Type, Description: w.Description, Digest: digest, Source: w.Source}
	}
	return events, nil
}

// reencode decodes fields into v, refusing values of the wrong JSON type
// and unknown fields of events.
func reencode(fields map[string]json.RawMessage, v *wireMeasurement) error {
	data, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Marshal encodes m as YAML in the format Parse reads, indices in order.
func (m M) Marshal() ([]byte, error) {
	var b strings.Builder
	for _, index := range m.Indices() {
		fmt.Fprintf(&b, "%d: {expected: %q, warnOnly: %t", index, hex.EncodeToString(m[index].Expected), m[index].WarnOnly)
		if also := m[index].AlsoAccepted; len(also) > 0 {
			quoted := make([]string, len(also))
			for i, a := range also {
				quoted[i] = strconv.Quote(hex.EncodeToString(a))
			}
			fmt.Fprintf(&b, ", alsoAccepted: [%s]", strings.Join(quoted, ", "))
		}
		if events := m[index].Events; len(events) > 0 {
			b.WriteString(", events: [")
			for i, e := range events {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "{type: %q, description: %q, digest: %q", e.Type, e.Description, hex.EncodeToString(e.Digest))
				if e.Source != "" {
					fmt.Fprintf(&b, ", source: %q", e.Source)
				}
				b.WriteString("}")
			}
			b.WriteString("]")
		}
		b.WriteString("}\n")
	}
	return []byte(b.String()), nil
}

// Indices returns the indices of m in increasing order.
func (m M) Indices() []uint32 {
	return slices.Sorted(maps.Keys(m))
}

// Mismatch is one reported measurement that differs from its reference value.
type Mismatch struct {
	Index    uint32
	Expected []byte
	Got      []byte // nil when the evidence did not report the index
	WarnOnly bool
}

func (mm Mismatch) String() string {
	got := "missing"
	if mm.Got != nil {
		got = hex.EncodeToString(mm.Got)
	}
	return fmt.Sprintf("index %d: expected %s, got %s", mm.Index, hex.EncodeToString(mm.Expected), got)
}

// mismatchError reports every enforced mismatch of a comparison.
type mismatchError struct {
	Mismatches []Mismatch
}

func (e *mismatchError) Error() string {
	parts := make([]string, len(e.Mismatches))
	for i, mm := range e.Mismatches {
		parts[i] = mm.String()
	}
	return "measurements differ from the reference values: " + strings.Join(parts, "; ")
}

// Compare checks got against m. It returns the warn-only mismatches, and a
// *mismatchError listing every enforced mismatch (all of them, not the first)
// when there is one. Indices in got that m does not name are not compared.
func (m M) Compare(got map[uint32][]byte) (warnings []Mismatch, err error) {
	var enforced []Mismatch
	for _, index := range m.Indices() {
		ref := m[index]
		value, ok := got[index]
		if ok && ref.Accepts(value) {
			continue
		}
		mm := Mismatch{Index: index, Expected: ref.Expected, WarnOnly: ref.WarnOnly}
		if ok {
			mm.Got = value
		}
		if ref.WarnOnly {
			warnings = append(warnings, mm)
		} else {
			enforced = append(enforced, mm)
		}
	}
	if len(enforced) > 0 {
		return warnings, &mismatchError{Mismatches: enforced}
	}
	return warnings, nil
}
