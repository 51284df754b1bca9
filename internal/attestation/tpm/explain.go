package tpm

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// maxListedEvents bounds the events an explanation lists for a PCR whose
// reference value names no expected events.
const maxListedEvents = 8

// ExplainMismatches explains, from a replayed TCG event log, why the PCRs
// of measured (SHA-256 values by index) that ref does not accept differ:
// one sentence per such PCR, in index order, for a refusal's message.
// Where ref's reference value lists the events expected behind it
// (measurements.Measurement.Events), the log's events of that PCR are
// compared with them in order, by type and digest, and the sentence names
// the first that differs, e.g.
//
//	PCR 11: event 5 EV_IPL ".cmdline": digest 3f2a9c0d11aa22bb… expected 9a41c3d2e0f1a2b3… (uki.efi section .cmdline)
//
// or the event that is extra or missing; otherwise it lists the log's
// events behind the PCR. events are a verified result's BootEvents; nil
// (the evidence carried no TCG event log) gives nil.
func ExplainMismatches(ref measurements.M, measured map[uint32][]byte, events []attestation.BootEvent) []string {
	if events == nil {
		return nil
	}
	var out []string
	for _, index := range ref.Indices() {
		want := ref[index]
		if got, ok := measured[index]; ok && want.Accepts(got) {
			continue
		}
		var logged []attestation.BootEvent
		for _, e := range events {
			if e.PCR == index {
				logged = append(logged, e)
			}
		}
		out = append(out, fmt.Sprintf("PCR %d: %s", index, explainPCR(logged, want.Events)))
	}
	return out
}

// explainPCR compares the logged events of one PCR with the expected ones.
func explainPCR(logged []attestation.BootEvent, expected []measurements.Event) string {
	if len(expected) == 0 {
		return listEvents(logged)
	}
	for i := 0; i < len(logged) || i < len(expected); i++ {
		switch {
		case i >= len(logged):
			return fmt.Sprintf("the event log has %d events for it, the reference value expects %d: missing %s",
				len(logged), len(expected), expectedEvent(expected[i]))
		case i >= len(expected):
			return fmt.Sprintf("%s is extra: the reference value expects %d events", loggedEvent(logged[i]), len(expected))
		}
		got, want := logged[i], expected[i]
		if got.Type != want.Type {
			return fmt.Sprintf("event %d %s %q: expected %s", got.Number, got.Type, got.Description, expectedEvent(want))
		}
		if !bytes.Equal(got.Digest, want.Digest) {
			return fmt.Sprintf("event %d %s %q: digest %s expected %s%s", got.Number, got.Type, got.Description,
				short(got.Digest), short(want.Digest), source(want))
		}
	}
	return fmt.Sprintf("its %d events are the expected ones, but the reference value's expected value is not what they replay to: "+
		"the reference values are inconsistent", len(logged))
}

// listEvents names the events behind a PCR, at most maxListedEvents.
func listEvents(logged []attestation.BootEvent) string {
	if len(logged) == 0 {
		return "the event log records no event for it"
	}
	parts := make([]string, 0, min(len(logged), maxListedEvents))
	for _, e := range logged[:min(len(logged), maxListedEvents)] {
		parts = append(parts, loggedEvent(e))
	}
	more := ""
	if len(logged) > maxListedEvents {
		more = fmt.Sprintf(" and %d more", len(logged)-maxListedEvents)
	}
	return fmt.Sprintf("the event log's %d events behind it (the reference value names none to compare): %s%s",
		len(logged), strings.Join(parts, ", "), more)
}

func loggedEvent(e attestation.BootEvent) string {
	return fmt.Sprintf("event %d %s %q digest %s", e.Number, e.Type, e.Description, short(e.Digest))
}

func expectedEvent(e measurements.Event) string {
	return fmt.Sprintf("%s %q digest %s%s", e.Type, e.Description, short(e.Digest), source(e))
}

func source(e measurements.Event) string {
	if e.Source == "" {
		return ""
	}
	return " (" + e.Source + ")"
}

// short abbreviates a digest to its first 8 bytes in hex.
func short(digest []byte) string {
	if len(digest) <= 8 {
		return hex.EncodeToString(digest)
	}
	return hex.EncodeToString(digest[:8]) + "…"
}

// ExplanationMarker starts the part of a refusal's message that
// ExplanationSuffix adds.
const ExplanationMarker = "; the TCG event log shows: "

// ExplanationSuffix formats ExplainMismatches' sentences as the end of a
// refusal's message: ExplanationMarker and the sentences joined by "; ",
// or "" when there are none.
func ExplanationSuffix(explanations []string) string {
	if len(explanations) == 0 {
		return ""
	}
	return ExplanationMarker + strings.Join(explanations, "; ")
}
