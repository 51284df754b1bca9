// Package signedvalues is the signed reference-value file: the PCR values
// an image build predicts for each node role, signed by the build, so that
// `gatehouse config generate --reference-values-from FILE --verify-key KEY`
// takes reference values only from whoever holds the signing key
// (docs/attestation.md, "Signed reference values").
//
// The file is a DSSE envelope (github.com/secure-systems-lab/dsse, the
// envelope of in-toto and sigstore) as JSON:
//
//	{"payloadType": "application/vnd.gatehouse.reference-values+json",
//	 "payload": "<base64 of the payload>",
//	 "signatures": [{"keyid": "<hex sha256 of the signer's PKIX public key>", "sig": "<base64>"}]}
//
// The signature covers DSSE's pre-authentication encoding of payloadType and
// payload. Ed25519 signs it directly; ECDSA P-256 signs its SHA-256 (ASN.1
// DER signature). The payload is canonical JSON (OLPC canonical JSON: keys
// sorted, no insignificant white space, as securesystemslib's cjson writes
// it):
//
//	{"apiVersion": "gatehouse.dev/v1", "kind": "ReferenceValues", "variant": "tpm",
//	 "platform": "qemu-ovmf",
//	 "image": {"name": "…", "version": "…", "manifestSha256": "<64 hex>", "rootHash": "<64 hex>"},
//	 "roles": {"controlPlane": <reference values>, "worker": <reference values>},
//	 "notes": ["…"]}
//
// where <reference values> is package measurements' file form as JSON
// (PCR index → {expected, warnOnly, alsoAccepted, events}). Verification is
// strict: the file is bounded in size, every object's fields are exactly the
// known ones, the payload type is this one, a signature by the verify key
// must verify, the payload must be canonical (so duplicate or case-variant
// keys cannot hide), and every value is a 32-byte SHA-256 PCR value of PCR
// 0-23 other than the node-lock PCR.
package signedvalues

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"unicode"

	"github.com/secure-systems-lab/go-securesystemslib/cjson"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

const (
	// payloadType is the DSSE payload type of a signed reference-value file.
	payloadType = "application/vnd.gatehouse.reference-values+json"
	apiVersion  = "gatehouse.dev/v1"
	kind        = "ReferenceValues"
	variant     = "tpm"
	// maxFileSize bounds a signed (or unsigned) file in bytes: two roles of
	// reference values (package measurements bounds each at 1 MiB) in
	// base64.
	maxFileSize = 4 << 20
	// maxPCR is the highest PCR index of a PC Client TPM (TCG PC Client
	// Platform TPM Profile §4.6: 24 PCRs).
	maxPCR = 23
)

// Image names the image the values were predicted for.
type Image struct {
	// Name is the image's name, e.g. "gatehouse-node".
	Name string `json:"name"`
	// Version is the image's version.
	Version string `json:"version"`
	// ManifestSHA256 is the hex SHA-256 of the build's manifest (64 hex
	// digits).
	ManifestSHA256 string `json:"manifestSha256"`
	// RootHash is the dm-verity root hash of the image's root file system
	// (hex SHA-256, 64 digits), which the measured command line carries.
	RootHash string `json:"rootHash"`
}

// Values is the content of a signed reference-value file.
type Values struct {
	// Platform names the firmware profile the values were predicted under,
	// e.g. "qemu-ovmf".
	Platform string
	// Image is the image the values were predicted for.
	Image Image
	// Roles holds each role's reference values (PCR index → SHA-256 value,
	// with the expected events behind it).
	Roles map[policy.Role]measurements.M
	// Notes say what the values do not cover and why (e.g. firmware PCRs a
	// platform profile has not measured yet).
	Notes []string
}

// wirePayload is the payload's file form.
type wirePayload struct {
	APIVersion string                     `json:"apiVersion"`
	Kind       string                     `json:"kind"`
	Variant    string                     `json:"variant"`
	Platform   string                     `json:"platform"`
	Image      Image                      `json:"image"`
	Roles      map[string]json.RawMessage `json:"roles"`
	Notes      []string                   `json:"notes,omitempty"`
}

var (
	payloadFields = []string{"apiVersion", "kind", "variant", "platform", "image", "roles", "notes"}
	imageFields   = []string{"name", "version", "manifestSha256", "rootHash"}
	platformName  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	sha256Hex     = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Payload returns v's payload: canonical JSON, the bytes that are signed
// and the unsigned file `gatehouse image sign-values` reads. Errors name the
// field that is invalid.
func (v Values) Payload() ([]byte, error) {
	if err := v.validate(); err != nil {
		return nil, err
	}
	roles := map[string]any{}
	for role, m := range v.Roles {
		roles[string(role)] = fileForm(m)
	}
	doc := map[string]any{
		"apiVersion": apiVersion, "kind": kind, "variant": variant, "platform": v.Platform,
		"image": map[string]any{"name": v.Image.Name, "version": v.Image.Version, "manifestSha256": v.Image.ManifestSHA256, "rootHash": v.Image.RootHash},
		"roles": roles,
	}
	if len(v.Notes) > 0 {
		doc["notes"] = v.Notes
	}
	return cjson.EncodeCanonical(doc)
}

// fileForm is m as package measurements' file form, in the shape Parse
// reads and canonical JSON can encode (strings, booleans, arrays, objects).
func fileForm(m measurements.M) map[string]any {
	out := make(map[string]any, len(m))
	for index, ref := range m {
		entry := map[string]any{"expected": hex.EncodeToString(ref.Expected), "warnOnly": ref.WarnOnly}
		if len(ref.AlsoAccepted) > 0 {
			also := make([]any, len(ref.AlsoAccepted))
			for i, a := range ref.AlsoAccepted {
				also[i] = hex.EncodeToString(a)
			}
			entry["alsoAccepted"] = also
		}
		if len(ref.Events) > 0 {
			events := make([]any, len(ref.Events))
			for i, e := range ref.Events {
				ev := map[string]any{"type": e.Type, "description": e.Description, "digest": hex.EncodeToString(e.Digest)}
				if e.Source != "" {
					ev["source"] = e.Source
				}
				events[i] = ev
			}
			entry["events"] = events
		}
		out[strconv.FormatUint(uint64(index), 10)] = entry
	}
	return out
}

// validate checks what Parse and Payload both require.
func (v Values) validate() error {
	if !platformName.MatchString(v.Platform) {
		return fmt.Errorf("platform %q: want a platform profile's name, lower-case letters, digits and '-' (e.g. qemu-ovmf)", v.Platform)
	}
	if v.Image.Name == "" || v.Image.Version == "" {
		return errors.New("image: name and version are required")
	}
	if !sha256Hex.MatchString(v.Image.ManifestSHA256) {
		return fmt.Errorf("image.manifestSha256 %q: want the build manifest's SHA-256, 64 lower-case hex digits", v.Image.ManifestSHA256)
	}
	if !sha256Hex.MatchString(v.Image.RootHash) {
		return fmt.Errorf("image.rootHash %q: want the dm-verity root hash, 64 lower-case hex digits", v.Image.RootHash)
	}
	if len(v.Roles) == 0 {
		return fmt.Errorf("roles is empty: give the reference values of %s and/or %s", policy.RoleControlPlane, policy.RoleWorker)
	}
	texts := map[string]string{"image.name": v.Image.Name, "image.version": v.Image.Version}
	for i, n := range v.Notes {
		texts[fmt.Sprintf("notes[%d]", i)] = n
	}
	for _, role := range slices.Sorted(maps.Keys(v.Roles)) {
		if role != policy.RoleControlPlane && role != policy.RoleWorker {
			return fmt.Errorf("roles.%s: unknown role; known roles are %s, %s", role, policy.RoleControlPlane, policy.RoleWorker)
		}
		m := v.Roles[role]
		if len(m) == 0 {
			return fmt.Errorf("roles.%s has no reference values", role)
		}
		for index, ref := range m {
			where := fmt.Sprintf("roles.%s.%d", role, index)
			if index > maxPCR {
				return fmt.Errorf("%s: PCR %d does not exist; a TPM has PCRs 0-%d", where, index, maxPCR)
			}
			if index == keys.NodeLockPCR {
				return fmt.Errorf("%s: PCR %d holds the node lock, which every policy checks itself; it is never a reference value", where, index)
			}
			for i, value := range ref.Values() {
				if len(value) != 32 {
					return fmt.Errorf("%s: value %d has %d bytes, want 32 (SHA-256)", where, i, len(value))
				}
			}
			for i, e := range ref.Events {
				if len(e.Digest) != 32 || e.Type == "" {
					return fmt.Errorf("%s.events[%d]: want a type and a 32-byte SHA-256 digest", where, i)
				}
				texts[fmt.Sprintf("%s.events[%d].type", where, i)] = e.Type
				texts[fmt.Sprintf("%s.events[%d].description", where, i)] = e.Description
				texts[fmt.Sprintf("%s.events[%d].source", where, i)] = e.Source
			}
		}
	}
	for _, field := range slices.Sorted(maps.Keys(texts)) {
		if i := bytes.IndexFunc([]byte(texts[field]), unicode.IsControl); i >= 0 {
			return fmt.Errorf("%s has a control character at byte %d: canonical JSON cannot carry it", field, i)
		}
	}
	return nil
}

// ParsePayload reads an unsigned payload (JSON or YAML; canonical form not
// required), the input of `gatehouse image sign-values`. Parsing is strict:
// unknown or misspelt fields, wrongly sized values and unknown roles are
// errors naming the field.
func ParsePayload(data []byte) (Values, error) {
	if len(data) > maxFileSize {
		return Values{}, fmt.Errorf("reference-value payload has %d bytes, at most %d allowed", len(data), maxFileSize)
	}
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return Values{}, fmt.Errorf("reference-value payload: %w", err)
	}
	return parsePayloadJSON(jsonData)
}

// parsePayloadJSON decodes a payload from JSON.
func parsePayloadJSON(data []byte) (Values, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return Values{}, fmt.Errorf("reference-value payload: want a JSON object: %w", err)
	}
	if err := exactFields("payload", fields, payloadFields); err != nil {
		return Values{}, err
	}
	var imageRaw map[string]json.RawMessage
	if err := json.Unmarshal(fields["image"], &imageRaw); err != nil {
		return Values{}, fmt.Errorf("reference-value payload: image: want an object: %w", err)
	}
	if err := exactFields("image", imageRaw, imageFields); err != nil {
		return Values{}, err
	}
	var w wirePayload
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return Values{}, fmt.Errorf("reference-value payload: %w", err)
	}
	switch {
	case w.APIVersion != apiVersion:
		return Values{}, fmt.Errorf("reference-value payload: apiVersion %q, want %q", w.APIVersion, apiVersion)
	case w.Kind != kind:
		return Values{}, fmt.Errorf("reference-value payload: kind %q, want %q", w.Kind, kind)
	case w.Variant != variant:
		return Values{}, fmt.Errorf("reference-value payload: variant %q: only %q (TPM PCR) values are signed", w.Variant, variant)
	}
	v := Values{Platform: w.Platform, Image: w.Image, Notes: w.Notes, Roles: map[policy.Role]measurements.M{}}
	for name, raw := range w.Roles {
		m, err := measurements.Parse(raw, 32)
		if err != nil {
			return Values{}, fmt.Errorf("reference-value payload: roles.%s: %w", name, err)
		}
		v.Roles[policy.Role(name)] = m
	}
	if err := v.validate(); err != nil {
		return Values{}, fmt.Errorf("reference-value payload: %w", err)
	}
	return v, nil
}

// exactFields refuses fields not in known, and names matched only
// case-insensitively (encoding/json alone would accept "ApiVersion").
func exactFields(what string, fields map[string]json.RawMessage, known []string) error {
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(known, name) {
			return fmt.Errorf("reference-value %s: unknown field %q (known: %v)", what, name, known)
		}
	}
	return nil
}

// Split divides v's roles into the reference values every role shares
// (same PCR, same values and events; an event's source may differ, and the
// first role's is kept) and each role's own, the form of a policy's
// referenceValues and roles.*.referenceValues. With one role, every value
// is both common and the role's (a role never goes without values).
func (v Values) Split() (common measurements.M, roles map[policy.Role]measurements.M) {
	common, roles = measurements.M{}, map[policy.Role]measurements.M{}
	names := slices.Sorted(maps.Keys(v.Roles))
	for _, r := range names {
		roles[r] = measurements.M{}
	}
	first := v.Roles[names[0]]
	for index, ref := range first {
		same := true
		for _, r := range names[1:] {
			other, ok := v.Roles[r][index]
			same = same && ok && equal(ref, other)
		}
		if same {
			common[index] = ref
		}
	}
	for _, r := range names {
		for index, ref := range v.Roles[r] {
			if _, shared := common[index]; !shared || len(names) == 1 {
				roles[r][index] = ref
			}
		}
	}
	return common, roles
}

// equal compares two measurements field by field, an event's Source
// aside (it names the file each role's value came from).
func equal(a, b measurements.Measurement) bool {
	if a.WarnOnly != b.WarnOnly || !bytes.Equal(a.Expected, b.Expected) ||
		!slices.EqualFunc(a.AlsoAccepted, b.AlsoAccepted, bytes.Equal) {
		return false
	}
	return slices.EqualFunc(a.Events, b.Events, func(x, y measurements.Event) bool {
		return x.Type == y.Type && x.Description == y.Description && bytes.Equal(x.Digest, y.Digest)
	})
}
