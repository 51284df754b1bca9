package predict

import (
	"bytes"
	"crypto/sha256"
	"debug/pe"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	saferwall "github.com/saferwall/pe"
	saferwalllog "github.com/saferwall/pe/log"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// unifiedSections are the UKI sections systemd-stub 252 measures into
// PCR 11, in its order (src/fundamental/tpm-pcr.h, UnifiedSection; .pcrsig
// is located but never measured, since it signs the result).
var unifiedSections = []string{".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".pcrpkey"}

// allSections are the names systemd-stub 252 looks for, .pcrsig included.
var allSections = append(slices.Clone(unifiedSections), ".pcrsig")

// imageSubsystemEFIApplication is IMAGE_SUBSYSTEM_EFI_APPLICATION (PE
// Format, "Windows Subsystem").
const imageSubsystemEFIApplication = 10

// uki is a unified kernel image as systemd-stub 252 and the firmware see
// it.
type uki struct {
	// name labels the file in sources, e.g. "uki-worker.efi".
	name string
	// sections maps each of allSections present to the bytes the stub
	// measures: VirtualSize bytes from the section's start (pe.c
	// locate_sections), zero-filled beyond its raw data as in memory.
	sections map[string][]byte
	// stub is the text of the .sdmagic section, which names systemd-stub's
	// version ("#### LoaderInfo: systemd-stub 252.39-1~deb12u2 ####").
	stub string
	// authenticode is the file's Authenticode SHA-256, which the firmware
	// extends into PCR 4 when it loads the UKI.
	authenticode []byte
}

// parseUKI reads a UKI: a PE32+ EFI application with a .linux section.
// Errors name what is wrong: not PE, no .linux, two sections systemd-stub
// would both take for one name, a layout whose Authenticode hash is
// ambiguous.
func parseUKI(name string, data []byte) (*uki, error) {
	f, err := pe.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s is not a PE file: %w", name, err)
	}
	opt, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok || opt.Subsystem != imageSubsystemEFIApplication {
		return nil, fmt.Errorf("%s is not a 64-bit EFI application (PE32+, subsystem 10)", name)
	}
	rawNames, err := rawSectionNames(data, f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	u := &uki{name: name, sections: map[string][]byte{}}
	for _, want := range allSections {
		var found []int
		for i, raw := range rawNames {
			// pe.c locate_sections: memcmp of the name's length against
			// the 8-byte header name, so ".linux" also takes ".linuxX".
			if strings.HasPrefix(raw, want) {
				found = append(found, i)
			}
		}
		if len(found) > 1 {
			return nil, fmt.Errorf("%s has %d sections systemd-stub takes for %s (it matches name prefixes, the last one wins): rebuild it with one", name, len(found), want)
		}
		if len(found) == 1 {
			s := f.Sections[found[0]]
			if rawNames[found[0]] != want {
				return nil, fmt.Errorf("%s: section %q would be measured as %s (systemd-stub matches name prefixes): rename it", name, rawNames[found[0]], want)
			}
			content, err := sectionContent(s, data)
			if err != nil {
				return nil, fmt.Errorf("%s section %s: %w", name, want, err)
			}
			u.sections[want] = content
		}
	}
	if i := slices.Index(rawNames, ".sdmagic"); i >= 0 {
		magic, err := sectionContent(f.Sections[i], data)
		if err != nil {
			return nil, fmt.Errorf("%s section .sdmagic: %w", name, err)
		}
		u.stub = string(bytes.TrimRight(magic, "\x00"))
	}
	if len(u.sections[".linux"]) == 0 {
		return nil, fmt.Errorf("%s has no .linux section: not a UKI (systemd-stub refuses to boot it)", name)
	}
	if u.authenticode, err = authenticode(data); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return u, nil
}

// rawSectionNames returns the 8-byte names of f's section headers as
// stored (debug/pe resolves long "/n" names through the string table;
// systemd-stub does not).
func rawSectionNames(data []byte, f *pe.File) ([]string, error) {
	if len(data) < 0x40 {
		return nil, errors.New("file too short for a DOS header")
	}
	peOffset := int(binary.LittleEndian.Uint32(data[0x3c:]))
	start := peOffset + 4 + 20 + int(f.SizeOfOptionalHeader)
	end := start + 40*len(f.Sections)
	if peOffset < 0 || start < 0 || end > len(data) {
		return nil, errors.New("section table beyond the end of the file")
	}
	names := make([]string, len(f.Sections))
	for i := range names {
		raw := data[start+40*i : start+40*i+8]
		if n := bytes.IndexByte(raw, 0); n >= 0 {
			raw = raw[:n]
		}
		names[i] = string(raw)
	}
	return names, nil
}

// sectionContent returns VirtualSize bytes of s, its raw data zero-filled
// to VirtualSize as the loader maps it.
func sectionContent(s *pe.Section, data []byte) ([]byte, error) {
	raw := min(s.VirtualSize, s.Size)
	if uint64(s.Offset)+uint64(raw) > uint64(len(data)) {
		return nil, errors.New("raw data beyond the end of the file")
	}
	content := make([]byte, s.VirtualSize)
	copy(content, data[s.Offset:s.Offset+raw])
	return content, nil
}

// authenticode returns the Authenticode SHA-256 of a PE image (Microsoft,
// "Windows Authenticode Portable Executable Signature Format"; TCG PC
// Client PFP §10.4.4 has the firmware extend it for
// EV_EFI_BOOT_SERVICES_APPLICATION), computed by github.com/saferwall/pe.
// saferwall hashes the file as it lies, skipping the checksum, the
// certificate table's directory entry and the table; EDK2 and the
// specification hash the headers, then the sections by file offset, then
// what follows. Both agree when the sections follow the headers and each
// other without gaps and a certificate table is last, which this checks.
// An unsigned file whose size is not a multiple of 8 is hashed as it is,
// as the firmware does; signing tools (osslsigncode, sbsign) pad it first.
func authenticode(data []byte) ([]byte, error) {
	f, err := pe.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("not a PE file: %w", err)
	}
	if err := checkContiguous(f, len(data)); err != nil {
		return nil, fmt.Errorf("its Authenticode hash is not well defined: %w", err)
	}
	file, err := saferwall.NewBytes(data, &saferwall.Options{Fast: true, Logger: saferwalllog.NewStdLogger(io.Discard)})
	if err != nil {
		return nil, fmt.Errorf("reading the PE file: %w", err)
	}
	if err := file.Parse(); err != nil {
		return nil, fmt.Errorf("reading the PE file: %w", err)
	}
	digest := file.Authentihash()
	if len(digest) != sha256.Size {
		return nil, errors.New("saferwall/pe computed no Authenticode hash (a malformed certificate table?)")
	}
	return digest, nil
}

// checkContiguous checks that the headers and the sections with raw data
// tile the file from 0 without gaps or overlaps, and that a certificate
// table (IMAGE_DIRECTORY_ENTRY_SECURITY, a file offset) is at the end.
func checkContiguous(f *pe.File, size int) error {
	opt, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok {
		return errors.New("not PE32+")
	}
	sections := slices.Clone(f.Sections)
	sections = slices.DeleteFunc(sections, func(s *pe.Section) bool { return s.Size == 0 })
	slices.SortFunc(sections, func(a, b *pe.Section) int { return int(a.Offset) - int(b.Offset) })
	next := uint64(opt.SizeOfHeaders)
	for _, s := range sections {
		if uint64(s.Offset) != next {
			return fmt.Errorf("section %s starts at file offset %#x, not at %#x where the one before ends", s.Name, s.Offset, next)
		}
		next += uint64(s.Size)
	}
	if next > uint64(size) {
		return fmt.Errorf("sections end at %#x, beyond the file's %#x bytes", next, size)
	}
	const securityDirectory = 4
	if opt.NumberOfRvaAndSizes > securityDirectory {
		cert := opt.DataDirectory[securityDirectory]
		if cert.Size > 0 && uint64(cert.VirtualAddress)+uint64(cert.Size) != uint64(size) {
			return fmt.Errorf("the certificate table (%#x, %d bytes) is not at the end of the file", cert.VirtualAddress, cert.Size)
		}
	}
	return nil
}

// pcr11Events returns the events systemd-stub 252 extends into PCR 11 for
// u (src/boot/efi/stub.c): for each measured section present, in
// unifiedSections order, an EV_IPL of the section's name with its NUL,
// then an EV_IPL of its content.
func (u *uki) pcr11Events() []measurements.Event {
	var events []measurements.Event
	for _, name := range unifiedSections {
		content, ok := u.sections[name]
		if !ok {
			continue
		}
		nameSum := sha256.Sum256(append([]byte(name), 0))
		contentSum := sha256.Sum256(content)
		events = append(events,
			measurements.Event{Type: "EV_IPL", Description: name, Digest: nameSum[:],
				Source: fmt.Sprintf("systemd-stub 252: the section name %q with its NUL (%d bytes)", name, len(name)+1)},
			measurements.Event{Type: "EV_IPL", Description: name, Digest: contentSum[:],
				Source: fmt.Sprintf("%s section %s (sha256 of %d bytes)", u.name, name, len(content))})
	}
	return events
}
