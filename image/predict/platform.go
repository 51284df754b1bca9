package predict

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// platformFiles are the embedded platform profiles, one YAML file per
// platform named after it.
//
//go:embed platforms/*.yaml
var platformFiles embed.FS

// platformPCRs are the PCRs a platform profile may fix: the firmware's
// (TCG PC Client Platform Firmware Profile §3.3.4: 0-7), but PCR 4, which
// the UKI determines (the profile gives the firmware's events around it).
var platformPCRs = []uint32{0, 1, 2, 3, 5, 6, 7}

// maxPlatformFile bounds a platform profile file in bytes.
const maxPlatformFile = 1 << 20

// Platform is a firmware profile: what a platform's firmware measures when
// it boots a UKI from a boot option. Its file form (YAML) is:
//
//	name: qemu-ovmf                      # lower-case letters, digits, '-'
//	description: QEMU q35 with Debian 12's OVMF 2022.11, Secure Boot off
//	source: "measured: event log sha256:… of a boot on 2026-07-01 (QEMU 7.2, ovmf 2022.11-6+deb12u2)"
//	secureBoot: false                    # the firmware's Secure Boot state
//	pcr4:
//	  before: [{type: EV_EFI_ACTION, description: "Calling EFI Application from Boot Option", digest: <hex>, source: "…"}, …]
//	  after: []
//	pcrs:                                # package measurements' file form, PCRs 0-3 and 5-7 only
//	  0: {expected: <hex>, events: [{type: EV_S_CRTM_VERSION, description: "…", digest: <hex>, source: "…"}, …]}
//
// pcr4.before are the events the firmware extends into PCR 4 before the
// UKI's EV_EFI_BOOT_SERVICES_APPLICATION, pcr4.after those after the UKI's
// own events. pcrs are the platform's PCR values; a PCR with events must
// replay from them (SHA-256 extends from zero, or from the locality of a
// StartupLocality event) to its expected value. `gatehouse image
// measure-platform` writes a profile from a real boot's TCG event log.
type Platform struct {
	name, description, source string
	secureBoot                bool
	pcr4Before, pcr4After     []measurements.Event
	pcrs                      measurements.M
}

// wirePlatform is a Platform's file form.
type wirePlatform struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Source      string          `json:"source"`
	SecureBoot  bool            `json:"secureBoot"`
	PCR4        wirePCR4        `json:"pcr4"`
	PCRs        json.RawMessage `json:"pcrs"`
}

type wirePCR4 struct {
	Before []wireEvent `json:"before"`
	After  []wireEvent `json:"after"`
}

// wireEvent is an event's file form, as in package measurements.
type wireEvent struct {
	Type        string `json:"type"`
	Description string `json:"description"`
	Digest      string `json:"digest"`
	Source      string `json:"source,omitempty"`
}

// embeddedPlatform returns the embedded profile name; an unknown name is an
// error listing the known ones.
func embeddedPlatform(name string) (Platform, error) {
	data, err := platformFiles.ReadFile("platforms/" + name + ".yaml")
	if errors.Is(err, fs.ErrNotExist) || strings.ContainsAny(name, "/.") {
		return Platform{}, fmt.Errorf("platform %q is unknown; known platforms: %s (or give a measured profile file)", name, strings.Join(knownPlatforms(), ", "))
	}
	if err != nil {
		return Platform{}, err
	}
	p, err := parsePlatform(data)
	if err != nil {
		return Platform{}, fmt.Errorf("embedded platform %s: %w", name, err)
	}
	return p, nil
}

// knownPlatforms lists the embedded profiles' names.
func knownPlatforms() []string {
	entries, _ := platformFiles.ReadDir("platforms")
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	return names
}

// loadPlatform returns the profile in file, or else the embedded profile
// name.
func loadPlatform(name, file string) (Platform, error) {
	if file == "" {
		return embeddedPlatform(name)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return Platform{}, fmt.Errorf("platform profile: %w", err)
	}
	p, err := parsePlatform(data)
	if err != nil {
		return Platform{}, fmt.Errorf("platform profile %s: %w", file, err)
	}
	if name != "" && p.name != name {
		return Platform{}, fmt.Errorf("platform profile %s is for platform %q, not %q", file, p.name, name)
	}
	return p, nil
}

// parsePlatform reads a profile strictly: unknown fields, bad digests,
// PCRs a platform does not own, and PCRs whose events do not replay to
// their expected value are errors naming the place.
func parsePlatform(data []byte) (Platform, error) {
	if len(data) > maxPlatformFile {
		return Platform{}, fmt.Errorf("%d bytes, at most %d allowed", len(data), maxPlatformFile)
	}
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return Platform{}, err
	}
	var w wirePlatform
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return Platform{}, err
	}
	if err := checkPlatformName(w.Name); err != nil {
		return Platform{}, err
	}
	p := Platform{name: w.Name, description: w.Description, source: w.Source, secureBoot: w.SecureBoot, pcrs: measurements.M{}}
	if p.pcr4Before, err = parseEvents("pcr4.before", w.PCR4.Before); err != nil {
		return Platform{}, err
	}
	if p.pcr4After, err = parseEvents("pcr4.after", w.PCR4.After); err != nil {
		return Platform{}, err
	}
	if len(w.PCRs) > 0 && !bytes.Equal(bytes.TrimSpace(w.PCRs), []byte("{}")) && !bytes.Equal(w.PCRs, []byte("null")) {
		if p.pcrs, err = measurements.Parse(w.PCRs, sha256.Size); err != nil {
			return Platform{}, fmt.Errorf("pcrs: %w", err)
		}
	}
	for _, index := range p.pcrs.Indices() {
		if !slices.Contains(platformPCRs, index) {
			return Platform{}, fmt.Errorf("pcrs.%d: a platform profile fixes only the firmware's PCRs %v; PCR 4 is the UKI's (give the firmware's events in pcr4)", index, platformPCRs)
		}
		m := p.pcrs[index]
		if len(m.Events) > 0 {
			if got := replay(m.Events); !bytes.Equal(got, m.Expected) {
				return Platform{}, fmt.Errorf("pcrs.%d: its events replay to %x, not to its expected value %x", index, got, m.Expected)
			}
		}
	}
	return p, nil
}

// checkPlatformName accepts lower-case letters, digits and '-', the names
// a signed reference-value file accepts.
func checkPlatformName(name string) error {
	if name == "" || len(name) > 63 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" || strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-") {
		return fmt.Errorf("platform name %q: want 1-63 lower-case letters, digits and inner '-'", name)
	}
	return nil
}

// parseEvents decodes events: each needs a type and a 32-byte hex digest.
func parseEvents(field string, wire []wireEvent) ([]measurements.Event, error) {
	events := make([]measurements.Event, 0, len(wire))
	for i, w := range wire {
		digest, err := hex.DecodeString(w.Digest)
		if w.Type == "" || err != nil || len(digest) != sha256.Size {
			return nil, fmt.Errorf("%s[%d]: want a type and a 64-digit hex SHA-256 digest", field, i)
		}
		events = append(events, measurements.Event{Type: w.Type, Description: w.Description, Digest: digest, Source: w.Source})
	}
	return events, nil
}

// Marshal returns p's file form (YAML), which parsePlatform reads back.
func (p Platform) Marshal() ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Platform profile %s (format: image/predict/platform.go; docs/image.md).\n", p.name)
	fmt.Fprintf(&b, "name: %s\ndescription: %s\nsource: %s\nsecureBoot: %t\npcr4:\n", p.name, strconv.Quote(p.description), strconv.Quote(p.source), p.secureBoot)
	for _, part := range []struct {
		name   string
		events []measurements.Event
	}{{"before", p.pcr4Before}, {"after", p.pcr4After}} {
		if len(part.events) == 0 {
			fmt.Fprintf(&b, "  %s: []\n", part.name)
			continue
		}
		fmt.Fprintf(&b, "  %s:\n", part.name)
		for _, e := range part.events {
			fmt.Fprintf(&b, "    - {type: %s, description: %s, digest: %s, source: %s}\n",
				strconv.Quote(e.Type), strconv.Quote(e.Description), hex.EncodeToString(e.Digest), strconv.Quote(e.Source))
		}
	}
	if len(p.pcrs) == 0 {
		b.WriteString("pcrs: {}\n")
		return []byte(b.String()), nil
	}
	values, err := p.pcrs.Marshal()
	if err != nil {
		return nil, err
	}
	b.WriteString("pcrs:\n")
	for _, line := range strings.SplitAfter(strings.TrimSuffix(string(values), "\n"), "\n") {
		b.WriteString("  " + line)
	}
	b.WriteString("\n")
	return []byte(b.String()), nil
}

// missingPCRs returns which of want the profile does not fix.
func (p Platform) missingPCRs(want []uint32) []uint32 {
	var missing []uint32
	for _, index := range want {
		if _, ok := p.pcrs[index]; !ok {
			missing = append(missing, index)
		}
	}
	return missing
}

// pcrIndices returns the profile's PCRs in order.
func (p Platform) pcrIndices() []uint32 { return slices.Sorted(maps.Keys(p.pcrs)) }
