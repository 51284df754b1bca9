package tpm

import (
	"bytes"
	"crypto"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// MaxTCGEventLogSize bounds a TCG event log in bytes. The log travels inside
// the evidence, which attestation.MaxEvidenceSize (128 KiB) bounds; this
// leaves 16 KiB for the quote, its signature, the attestation key and its
// or the EK's certificates (a Compute Engine AK chain is about 5 KiB). Real
// UEFI logs are 15–60 KiB: go-eventlog's recorded logs of Arch Linux with
// systemd-boot (15 KiB), Compute Engine Ubuntu 24.04 with Secure Boot and a
// full dbx (45 KiB), Ubuntu 24.04 under TDX (59 KiB).
const MaxTCGEventLogSize = 112 << 10

// bootEvents replays the TCG event log (nil when the evidence carries none
// and the policy does not require one) to the quoted pcrs.
func (v *QuoteVerifier) bootEvents(log []byte, pcrs map[uint32][]byte) ([]attestation.BootEvent, error) {
	if len(log) == 0 {
		if v.policy.RequireEventLog {
			return nil, fmt.Errorf("%w: the policy requires the TCG event log (requireEventLog) and the evidence carries none: "+
				"the node's bootstrapper sends it from --tcg-event-log, by default %s", attestation.ErrPolicy, DefaultTCGEventLogPath)
		}
		return nil, nil
	}
	return v.replays.replay(log, pcrs, v.policy.PCRs)
}

// DefaultTCGEventLogPath is where Linux exposes the TCG event log of the
// first TPM: the firmware's log, with the events the firmware recorded
// after handing it over (the final events table).
const DefaultTCGEventLogPath = "/sys/kernel/security/tpm0/binary_bios_measurements"

// tcgEventLogField is TPMEvidence.tcg_event_log's field number.
const tcgEventLogField = 10

// splitTCGEventLog finds the TCG event log in marshalled TPMEvidence and
// returns the evidence without it, to decode, and the log, a slice of
// evidence: decoding would copy it, and it is most of the evidence's
// bytes. It returns evidence itself when the log is absent or the
// encoding does not scan (the decoder then names what is wrong). The log
// twice is ErrMalformed: the attester sends it once.
func splitTCGEventLog(evidence []byte) (rest, log []byte, err error) {
	start, end := -1, -1
	for b := evidence; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return evidence, nil, nil
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return evidence, nil, nil
		}
		if num == tcgEventLogField && typ == protowire.BytesType {
			if start >= 0 {
				return nil, nil, fmt.Errorf("%w: TPM evidence carries the TCG event log twice", attestation.ErrMalformed)
			}
			start, end = len(evidence)-len(b), len(evidence)-len(b)+n+m
			log, _ = protowire.ConsumeBytes(b[n:])
		}
		b = b[n+m:]
	}
	if start < 0 {
		return evidence, nil, nil
	}
	rest = make([]byte, 0, len(evidence)-(end-start))
	rest = append(append(rest, evidence[:start]...), evidence[end:]...)
	return rest, log, nil
}

// maxDescription bounds BootEvent.Description in characters.
const maxDescription = 160

// replayTCGEventLog parses a TCG event log (TCG PC Client Platform
// Firmware Profile §10.2: a Spec ID event, then crypto-agile
// TCG_PCR_EVENT2 records) with go-eventlog and replays its SHA-256 digests
// from the PCRs' reset values, checking every PCR of pcrs (SHA-256 values,
// 32 bytes, by index) that the log extends. It returns the events of those
// PCRs in log order, never nil. Events of PCRs outside pcrs are not
// verified and not returned. Errors wrap attestation.ErrMalformed (the log
// does not parse or exceeds MaxTCGEventLogSize) or attestation.ErrPolicy
// (it has no SHA-256 digests, or does not replay, naming the PCRs).
func replayTCGEventLog(data []byte, pcrs map[uint32][]byte) ([]attestation.BootEvent, error) {
	if len(data) > MaxTCGEventLogSize {
		return nil, fmt.Errorf("%w: TCG event log has %d bytes, at most %d allowed", attestation.ErrMalformed, len(data), MaxTCGEventLogSize)
	}
	el, err := tcg.ParseEventLog(data, tcg.ParseOpts{})
	if err != nil {
		return nil, fmt.Errorf("%w: parsing the TCG event log: %w", attestation.ErrMalformed, err)
	}
	if !slices.Contains(el.Algs, register.HashSHA256) {
		algs := make([]string, len(el.Algs))
		for i, a := range el.Algs {
			algs[i] = a.String()
		}
		return nil, fmt.Errorf("%w: the TCG event log records %s digests, no SHA-256: it cannot replay the quoted SHA-256 PCRs",
			attestation.ErrPolicy, strings.Join(algs, ", "))
	}
	indices := make([]int, 0, len(pcrs))
	for index := range pcrs {
		indices = append(indices, int(index))
	}
	slices.Sort(indices)
	mrs := make([]register.MR, len(indices))
	for i, index := range indices {
		mrs[i] = register.PCR{Index: index, Digest: pcrs[uint32(index)], DigestAlg: crypto.SHA256}
	}
	replayed, err := el.Verify(mrs)
	if err != nil {
		var replayErr tcg.ReplayError
		if errors.As(err, &replayErr) {
			bad := slices.Sorted(slices.Values(replayErr.InvalidMRs))
			return nil, fmt.Errorf("%w: the TCG event log does not replay to the quoted value of PCR %s: "+
				"it was altered or truncated, or is not the log of this boot", attestation.ErrPolicy, joinInts(bad))
		}
		return nil, fmt.Errorf("%w: replaying the TCG event log: %w", attestation.ErrMalformed, err)
	}
	events := make([]attestation.BootEvent, len(replayed))
	for i, e := range replayed {
		events[i] = attestation.BootEvent{
			Number:      e.Num(),
			PCR:         e.MRIndex(),
			Type:        e.Type.TCGString(),
			Description: describeEvent(e.Type, e.Data),
			Digest:      e.Digest,
		}
	}
	return events, nil
}

// joinInts formats PCR indices as "4, 7".
func joinInts(values []int) string {
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ", ")
}

// describeEvent decodes what an event's data says was measured (Firmware
// Profile §10.4: the event data of each type), for people: never compared,
// as the quote covers only the digest. "" when the data says nothing
// readable.
func describeEvent(typ tcg.EventType, data []byte) string {
	switch typ {
	case tcg.EFIVariableDriverConfig, tcg.EFIVariableBoot, tcg.EFIVariableBoot2, tcg.EFIVariableAuthority:
		return variableName(data)
	case tcg.EFIBootServicesApplication, tcg.EFIBootServicesDriver, tcg.EFIRuntimeServicesDriver:
		return imagePath(data)
	case tcg.EFIPlatformFirmwareBlob2, tcg.EFIHandoffTables2:
		// A UINT8 description size, then the description (§10.4.4).
		if len(data) > 0 && int(data[0]) < len(data) {
			return text(data[1 : 1+int(data[0])])
		}
		return ""
	case tcg.EventTag:
		tagged, err := tcg.ParseTaggedEventData(data)
		if err != nil {
			return ""
		}
		return text(tagged.Data)
	case tcg.Separator, tcg.EFIGPTEvent, tcg.EFIPlatformFirmwareBlob, tcg.EFIHandoffTables, tcg.NoAction:
		return ""
	}
	// EV_IPL (systemd-stub's UKI sections, GRUB's commands), EV_EFI_ACTION,
	// EV_POST_CODE, EV_S_CRTM_VERSION, ...: a string, ASCII or UTF-16.
	return text(data)
}

// variableName returns the name of a UEFI_VARIABLE_DATA (§10.4.3: the
// variable's GUID, UINT64 UnicodeNameLength in characters, UINT64
// VariableDataLength, then the UTF-16 name and the data), e.g.
// "SecureBoot" or "Boot0001"; "" when the sizes do not fit the data.
func variableName(data []byte) string {
	const header = 32
	if len(data) < header {
		return ""
	}
	nameLen := binary.LittleEndian.Uint64(data[16:])
	if nameLen > uint64(len(data)-header)/2 {
		return ""
	}
	return text16(data[header : header+2*nameLen])
}

// imagePath returns the file path nodes of an UEFI_IMAGE_LOAD_EVENT's
// device path (§10.4.2; UEFI 2.10 §10.3.5.4 File Path Media Device Path),
// e.g. `\EFI\BOOT\BOOTX64.EFI`; "" when it has none (an image in a firmware
// volume).
func imagePath(data []byte) string {
	img, err := tcg.ParseEFIImageLoad(bytes.NewReader(data))
	if err != nil {
		return ""
	}
	elements, err := img.DevicePath()
	if err != nil {
		return ""
	}
	const filePath = 0x04
	var path strings.Builder
	for _, e := range elements {
		if e.Type != tcg.MediaDevice || e.Subtype != filePath || len(e.Data)%2 != 0 {
			continue
		}
		path.WriteString(text16(e.Data))
	}
	return text([]byte(path.String()))
}

// text decodes event data holding a string: UTF-16LE (what EFI
// applications such as systemd-stub log) or ASCII/UTF-8, without its
// terminating NULs. "" when the data is not mostly text.
func text(data []byte) string {
	if len(data) >= 2 && len(data)%2 == 0 && data[1] == 0 && data[0] != 0 {
		return text16(data)
	}
	// Past 4 bytes a character, the rest is cut anyway.
	data = bytes.TrimRight(data[:min(len(data), 4*maxDescription)], "\x00")
	var b strings.Builder
	b.Grow(len(data))
	n, bad := 0, 0
	for len(data) > 0 && n < maxDescription {
		r, size := utf8.DecodeRune(data)
		data = data[size:]
		bad += add(&b, r)
		n++
	}
	return described(&b, n, bad, len(data) > 0)
}

// text16 decodes UTF-16LE data without its terminating NULs.
func text16(data []byte) string {
	for len(data) >= 2 && data[len(data)-2] == 0 && data[len(data)-1] == 0 {
		data = data[:len(data)-2]
	}
	var b strings.Builder
	b.Grow(min(len(data)/2, maxDescription))
	n, bad := 0, 0
	for len(data) >= 2 && n < maxDescription {
		r := rune(binary.LittleEndian.Uint16(data))
		data = data[2:]
		if utf16.IsSurrogate(r) && len(data) >= 2 {
			r = utf16.DecodeRune(r, rune(binary.LittleEndian.Uint16(data)))
			data = data[2:]
		}
		bad += add(&b, r)
		n++
	}
	return described(&b, n, bad, len(data) > 0)
}

// add writes r to b, U+FFFD for what is not printable, and returns 1 for
// that, 0 otherwise.
func add(b *strings.Builder, r rune) int {
	if !unicode.IsPrint(r) {
		b.WriteRune(unicode.ReplacementChar)
		return 1
	}
	b.WriteRune(r)
	return 0
}

// described returns the n characters in b, "…" added when more were cut,
// or "" when more than a quarter of them were not printable (binary data).
func described(b *strings.Builder, n, bad int, cut bool) string {
	if 4*bad > n {
		return ""
	}
	if cut {
		b.WriteString("…")
	}
	return b.String()
}
