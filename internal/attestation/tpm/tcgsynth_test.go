package tpm_test

import (
	"crypto"
	"crypto/sha256"
	"encoding/binary"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// event is one event for synthesize.
type event struct {
	pcr    uint32
	typ    tcg.EventType
	data   []byte // the event data
	digest []byte // SHA-256 of what was measured
}

// ukiBoot is what OVMF and systemd-stub (systemd 252, src/boot/efi/stub.c)
// measure when booting a UKI whose command line is cmdline: the boot
// attempt and the UKI in PCR 4, and in PCR 11, for each section, its name
// (with the NUL) and then its contents, logged as EV_IPL with the section
// name in UTF-16.
func ukiBoot(cmdline string) []event {
	kernel := sha256.Sum256([]byte("uki.efi Authenticode"))
	events := []event{
		{pcr: 4, typ: tcg.EFIAction, data: []byte(tcg.CallingEFIApplication), digest: sum([]byte(tcg.CallingEFIApplication))},
		{pcr: 4, typ: tcg.Separator, data: make([]byte, 4), digest: sum(make([]byte, 4))},
		{pcr: 4, typ: tcg.EFIBootServicesApplication, data: imageLoad(`\EFI\BOOT\BOOTX64.EFI`), digest: kernel[:]},
	}
	for _, s := range []struct{ name, contents string }{
		{".linux", "vmlinuz"}, {".osrel", "ID=debian\n"}, {".cmdline", cmdline}, {".initrd", "initrd"},
	} {
		events = append(events,
			event{pcr: 11, typ: tcg.Ipl, data: utf16z(s.name), digest: sum([]byte(s.name + "\x00"))},
			event{pcr: 11, typ: tcg.Ipl, data: utf16z(s.name), digest: sum([]byte(s.contents))})
	}
	return events
}

func sum(data []byte) []byte {
	s := sha256.Sum256(data)
	return s[:]
}

// utf16z encodes s as NUL-terminated UTF-16LE, as EFI applications log.
func utf16z(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s + "\x00")) {
		b = binary.LittleEndian.AppendUint16(b, u)
	}
	return b
}

// imageLoad is an UEFI_IMAGE_LOAD_EVENT whose device path is one File
// Path Media node holding path.
func imageLoad(path string) []byte {
	name := utf16z(path)
	var node []byte
	node = append(node, 0x04, 0x04)
	node = binary.LittleEndian.AppendUint16(node, uint16(4+len(name)))
	node = append(node, name...)
	node = append(node, 0x7f, 0xff, 0x04, 0x00) // end of the device path
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, 0x1000) // ImageLocationInMemory
	b = binary.LittleEndian.AppendUint64(b, 0x2000) // ImageLengthInMemory
	b = binary.LittleEndian.AppendUint64(b, 0)      // ImageLinkTimeAddress
	b = binary.LittleEndian.AppendUint64(b, uint64(len(node)))
	return append(b, node...)
}

// synthesize writes a crypto-agile TCG event log (TCG PC Client Platform
// Firmware Profile §10.2.1 and §10.2.2: the Spec ID event as a
// TCG_PCR_EVENT, then TCG_PCR_EVENT2 records) of events, each with a
// digest of every alg in algs (the SHA-256 digest given, others derived
// from it).
func synthesize(t testing.TB, algs []tpm2.Algorithm, events []event) []byte {
	t.Helper()
	le := binary.LittleEndian
	var spec []byte
	spec = append(spec, "Spec ID Event03\x00"...)
	spec = le.AppendUint32(spec, 0) // platformClass
	spec = append(spec, 0, 2, 0, 2) // specVersionMinor, Major, specErrata, uintnSize
	spec = le.AppendUint32(spec, uint32(len(algs)))
	for _, alg := range algs {
		h, err := alg.Hash()
		if err != nil {
			t.Fatal(err)
		}
		spec = le.AppendUint16(spec, uint16(alg))
		spec = le.AppendUint16(spec, uint16(h.Size()))
	}
	spec = append(spec, 0) // vendorInfoSize
	var log []byte
	log = le.AppendUint32(log, 0)
	log = le.AppendUint32(log, uint32(tcg.NoAction))
	log = append(log, make([]byte, 20)...)
	log = le.AppendUint32(log, uint32(len(spec)))
	log = append(log, spec...)
	for _, e := range events {
		log = le.AppendUint32(log, e.pcr)
		log = le.AppendUint32(log, uint32(e.typ))
		log = le.AppendUint32(log, uint32(len(algs)))
		for _, alg := range algs {
			log = le.AppendUint16(log, uint16(alg))
			h, _ := alg.Hash()
			if h == crypto.SHA256 {
				log = append(log, e.digest...)
				continue
			}
			d := h.New()
			d.Write(e.digest)
			log = append(log, d.Sum(nil)...)
		}
		log = le.AppendUint32(log, uint32(len(e.data)))
		log = append(log, e.data...)
	}
	return log
}

// expectedEvents are the events of boot in pcr as reference values list
// them.
func expectedEvents(boot []event, pcr uint32) []measurements.Event {
	var out []measurements.Event
	for _, e := range boot {
		if e.pcr != pcr {
			continue
		}
		name := strings.TrimRight(string(utf16.Decode(u16(e.data))), "\x00")
		if e.typ != tcg.Ipl {
			name = ""
		}
		out = append(out, measurements.Event{Type: e.typ.TCGString(), Description: name, Digest: e.digest, Source: "uki.efi section " + name})
	}
	return out
}

func u16(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

// replayed returns the SHA-256 value events leave pcr at.
func replayed(events []event, pcr uint32) []byte {
	v := make([]byte, sha256.Size)
	for _, e := range events {
		if e.pcr == pcr {
			v = sum(append(v, e.digest...))
		}
	}
	return v
}
