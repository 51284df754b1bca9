package predict

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// DefaultPlatformPCRs are the firmware PCRs a platform profile fixes
// unless asked otherwise: code (0, 2), configuration (1, 3) and Secure
// Boot policy (7); 5 and 6 depend on the disk and the machine's state and
// are left out.
var DefaultPlatformPCRs = []uint32{0, 1, 2, 3, 7}

// PlatformFromEventLog makes a platform profile from the TCG event log of
// a real boot of the platform (the firmware's
// /sys/kernel/security/tpm0/binary_bios_measurements, TCG PC Client PFP
// §10, crypto-agile with SHA-256), parsed with go-eventlog: for each of
// pcrs (firmware PCRs 0-3 and 5-7) its value replayed from the log and
// its events, and PCR 4's events before the first
// EV_EFI_BOOT_SERVICES_APPLICATION (the firmware's part; the rest is the
// UKI's). name and description name the platform; source says where and
// when the log was taken (e.g. "QEMU 7.2 q35, ovmf 2022.11-6+deb12u2, booted
// 2026-07-01"). The log itself is not authenticated: take it from a machine
// you trust, or check it against a quote first (gatehouse verify).
func PlatformFromEventLog(log []byte, name, description, source string, pcrs []uint32) (Platform, error) {
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return Platform{}, fmt.Errorf("parsing the event log: %w", err)
	}
	if !slices.Contains(el.Algs, register.HashSHA256) {
		return Platform{}, fmt.Errorf("the event log has no SHA-256 digests (algorithms %v): Gatehouse quotes the SHA-256 bank", el.Algs)
	}
	for _, index := range pcrs {
		if !slices.Contains(platformPCRs, index) {
			return Platform{}, fmt.Errorf("PCR %d: a platform profile fixes only the firmware's PCRs %v", index, platformPCRs)
		}
	}
	sum := sha256.Sum256(log)
	logID := "event log sha256:" + hex.EncodeToString(sum[:8])
	p := Platform{
		name: name, description: description, pcrs: measurements.M{},
		source: fmt.Sprintf("measured: %s (%s), PCRs %v and PCR 4's firmware events; %s", logID, hex.EncodeToString(sum[:]), pcrs, source),
	}
	if err := checkPlatformName(name); err != nil {
		return Platform{}, err
	}
	byPCR := map[uint32][]measurements.Event{}
	applicationSeen := false
	for i, e := range el.Events(register.HashSHA256) {
		index := uint32(e.Index)
		if on, ok := secureBootState(e); ok {
			p.secureBoot = on
		}
		if !slices.Contains(pcrs, index) && (index != 4 || applicationSeen) {
			continue
		}
		if index == 4 && e.Type == tcg.EFIBootServicesApplication {
			applicationSeen = true
			continue
		}
		ev, ok, err := explain(e, fmt.Sprintf("%s, event %d", logID, i+1))
		if err != nil {
			return Platform{}, fmt.Errorf("PCR %d, event %d (%s): %w", index, i+1, e.Type.TCGString(), err)
		}
		if ok {
			byPCR[index] = append(byPCR[index], ev)
		}
	}
	if !applicationSeen {
		return Platform{}, errors.New("the event log has no EV_EFI_BOOT_SERVICES_APPLICATION in PCR 4: it is not the log of a boot that started a UEFI application from a boot option")
	}
	p.pcr4Before = byPCR[4]
	for _, index := range pcrs {
		events := byPCR[index]
		if len(events) == 0 {
			return Platform{}, fmt.Errorf("the event log has no event in PCR %d; leave it out of the profile's PCRs", index)
		}
		p.pcrs[index] = measurements.Measurement{Expected: replay(events), Events: events}
	}
	return p, nil
}

// secureBootState reads the SecureBoot variable's value from its PCR 7
// measurement (TCG PC Client PFP §3.3.4.8: EV_EFI_VARIABLE_DRIVER_CONFIG
// of SecureBoot, one byte, 1 when enabled).
func secureBootState(e tcg.Event) (on, ok bool) {
	if e.Index != 7 || e.Type != tcg.EFIVariableDriverConfig {
		return false, false
	}
	v, err := tcg.ParseUEFIVariableData(bytes.NewReader(e.Data))
	if err != nil || v.VarName() != "SecureBoot" {
		return false, false
	}
	return len(v.VariableData) > 0 && v.VariableData[0] == 1, true
}

// explain turns a log event into an expected event; EV_NO_ACTION events are
// dropped except the StartupLocality that sets PCR 0's initial value.
func explain(e tcg.Event, source string) (measurements.Event, bool, error) {
	if len(e.Digest) != sha256.Size {
		return measurements.Event{}, false, errors.New("no SHA-256 digest")
	}
	ev := measurements.Event{Type: e.Type.TCGString(), Digest: e.Digest, Source: source}
	if e.Type == tcg.NoAction {
		if e.Index == 0 && len(e.Data) == 17 && bytes.HasPrefix(e.Data, []byte("StartupLocality")) {
			ev.Description = fmt.Sprintf("StartupLocality %d", e.Data[16])
			ev.Digest = make([]byte, sha256.Size)
			return ev, true, nil
		}
		return measurements.Event{}, false, nil
	}
	ev.Description = describe(e)
	return ev, true, nil
}

// describe says in a line what an event measured: a UEFI variable's name,
// an action's string, or the event data as text when it is text.
func describe(e tcg.Event) string {
	switch e.Type {
	case tcg.Separator:
		return "separator"
	case tcg.EFIVariableDriverConfig, tcg.EFIVariableBoot, tcg.EFIVariableBoot2, tcg.EFIVariableAuthority:
		if v, err := tcg.ParseUEFIVariableData(bytes.NewReader(e.Data)); err == nil {
			return printable(v.VarName())
		}
	case tcg.EFIPlatformFirmwareBlob, tcg.EFIPlatformFirmwareBlob2:
		if e.Type == tcg.EFIPlatformFirmwareBlob2 && len(e.Data) > 0 && int(e.Data[0]) < len(e.Data) {
			return printable(string(e.Data[1 : 1+int(e.Data[0])]))
		}
		return "firmware blob"
	case tcg.EFIHandoffTables, tcg.EFIHandoffTables2:
		return "handoff tables"
	case tcg.EFIGPTEvent:
		return "GPT"
	}
	if text, ok := asText(e.Data); ok {
		return printable(text)
	}
	return fmt.Sprintf("%d bytes", len(e.Data))
}

// asText decodes data as ASCII or UTF-16LE text (either NUL-terminated).
func asText(data []byte) (string, bool) {
	trimmed := bytes.TrimRight(data, "\x00")
	if len(trimmed) == 0 {
		return "", false
	}
	if isPrintable(string(trimmed)) {
		return string(trimmed), true
	}
	if len(data)%2 == 0 {
		units := make([]uint16, len(data)/2)
		for i := range units {
			units[i] = binary.LittleEndian.Uint16(data[2*i:])
		}
		for len(units) > 0 && units[len(units)-1] == 0 {
			units = units[:len(units)-1]
		}
		if s := string(utf16.Decode(units)); len(units) > 0 && isPrintable(s) {
			return s, true
		}
	}
	return "", false
}

func isPrintable(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

// printable keeps a description to one line of at most 120 printable
// characters.
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return '?'
	}, s)
	if r := []rune(s); len(r) > 120 {
		s = string(r[:117]) + "..."
	}
	return s
}

// replay extends events into a SHA-256 PCR (TPM 2.0 Part 1 §17.2:
// new = SHA-256(old || digest)) and returns its value. The PCR starts at
// zero, or at the locality of a StartupLocality event (TCG PC Client PFP
// §10.4.5.3: the last byte set to it); an EV_EFI_HCRTM_EVENT resets it to
// 0…04 first; other EV_NO_ACTION events extend nothing.
func replay(events []measurements.Event) []byte {
	pcr := make([]byte, sha256.Size)
	for _, e := range events {
		switch e.Type {
		case "EV_NO_ACTION":
			var locality byte
			if _, err := fmt.Sscanf(e.Description, "StartupLocality %d", &locality); err == nil {
				pcr[sha256.Size-1] = locality
			}
			continue
		case "EV_EFI_HCRTM_EVENT":
			pcr = make([]byte, sha256.Size)
			pcr[sha256.Size-1] = 4
		}
		h := sha256.New()
		h.Write(pcr)
		h.Write(e.Digest)
		pcr = h.Sum(nil)
	}
	return pcr
}
