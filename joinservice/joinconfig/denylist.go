package joinconfig

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// KeyDenyList is the key of the deny list ConfigMap: one entry per line,
// '#' starts a comment. An entry is an identity that attestation evidence
// proves (attestation.Result.Identities; see entryForms) or
// "node:<node name>" (docs/joinservice.md, "Deny list").
const KeyDenyList = "denied"

// prefixNode starts a deny-list entry naming a node: "node:<node name>".
const prefixNode = "node:"

// entryForm is one form of deny-list entry: its prefix, how its value is
// spelled, and what checks and normalises the value.
type entryForm struct {
	prefix, shape string
	canonical     func(value string) (string, error)
}

// entryForms are the entry forms of a deny list, as
// attestation.Result.Identities spells them.
var entryForms = []entryForm{
	{attestation.PrefixAK, "<64 hex digits>", hexDigits(64)},
	{attestation.PrefixEK, "<64 hex digits of the issuer's SHA-256>:<hex serial number>", ekValue},
	{attestation.PrefixSNPChip, "<128 hex digits of CHIP_ID>", hexDigits(128)},
	{attestation.PrefixTDXPPID, "<32 hex digits of the PPID>", hexDigits(32)},
	{attestation.PrefixGCEInstance, "<project ID>/<zone>/<numeric instance ID>", gceValue},
	{attestation.PrefixAWSInstance, "<EC2 instance ID, i- and 8 or 17 hex digits>", awsValue},
	{prefixNode, "<node name>", nodeValue},
}

// DenyList is a parsed deny list: the identities and node names refused
// on every request, in canonical form. The zero value denies nothing.
type DenyList struct {
	entries map[string]bool
}

// ParseDenyList parses the deny list format (see KeyDenyList). Hex digits
// may be of either case and a serial number may have leading zeros (as
// openssl prints it); entries are kept in the canonical form of
// attestation.Result.Identities. An entry of an unknown form, or a value
// that no evidence could prove (a wrong length, a character out of place),
// is an error naming its line and the forms.
func ParseDenyList(text string) (DenyList, error) {
	d := DenyList{entries: map[string]bool{}}
	for i, line := range strings.Split(text, "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		entry, err := canonicalEntry(line)
		if err != nil {
			return DenyList{}, fmt.Errorf("deny list line %d: %q %w", i+1, line, err)
		}
		d.entries[entry] = true
	}
	return d, nil
}

// canonicalEntry checks line against the entry forms and returns it in
// canonical form.
func canonicalEntry(line string) (string, error) {
	for _, f := range entryForms {
		value, ok := strings.CutPrefix(line, f.prefix)
		if !ok {
			continue
		}
		canonical, err := f.canonical(value)
		if err != nil {
			return "", fmt.Errorf("is not %s%s: %w", f.prefix, f.shape, err)
		}
		return f.prefix + canonical, nil
	}
	forms := make([]string, 0, len(entryForms))
	for _, f := range entryForms {
		forms = append(forms, f.prefix+f.shape)
	}
	return "", fmt.Errorf("is none of the entry forms %s", strings.Join(forms, ", "))
}

// hexDigits accepts exactly n hex digits, returning them in lower case.
func hexDigits(n int) func(string) (string, error) {
	return func(v string) (string, error) {
		if len(v) != n {
			return "", fmt.Errorf("%d characters, want %d hex digits", len(v), n)
		}
		if !isHex(v) {
			return "", errors.New("not hex")
		}
		return strings.ToLower(v), nil
	}
}

func isHex(v string) bool {
	return v != "" && strings.Trim(v, "0123456789abcdefABCDEF") == ""
}

// ekValue accepts "<64 hex digits>:<hex serial>", the serial without
// leading zeros in the canonical form (attestation.CertificateName).
func ekValue(v string) (string, error) {
	issuer, serial, ok := strings.Cut(v, ":")
	if !ok {
		return "", fmt.Errorf("no ':' between the issuer digest and the serial number")
	}
	issuer, err := hexDigits(64)(issuer)
	if err != nil {
		return "", fmt.Errorf("issuer digest: %w", err)
	}
	if !isHex(serial) || len(serial) > 128 {
		return "", fmt.Errorf("serial number %q is not 1 to 128 hex digits", serial)
	}
	serial = strings.TrimLeft(strings.ToLower(serial), "0")
	if serial == "" {
		serial = "0"
	}
	return issuer + ":" + serial, nil
}

// gceValue accepts "<project ID>/<zone>/<instance ID>" (as
// attestation.GCEInstance spells it): a project ID of lower-case letters,
// digits, '-', and a domain-scoped project's '.' and ':'; a zone of
// lower-case letters, digits and '-'; a decimal 64-bit instance ID.
func gceValue(v string) (string, error) {
	parts := strings.Split(v, "/")
	if len(parts) != 3 {
		return "", fmt.Errorf("%d parts separated by '/', want 3", len(parts))
	}
	project, zone, id := parts[0], parts[1], parts[2]
	if !onlyRunes(project, "abcdefghijklmnopqrstuvwxyz0123456789-.:") {
		return "", fmt.Errorf("project ID %q is not lower-case letters, digits, '-', '.' and ':'", project)
	}
	if !onlyRunes(zone, "abcdefghijklmnopqrstuvwxyz0123456789-") {
		return "", fmt.Errorf("zone %q is not lower-case letters, digits and '-'", zone)
	}
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil || !onlyRunes(id, "0123456789") {
		return "", fmt.Errorf("instance ID %q is not a decimal number (the instance's id, not its name)", id)
	}
	return project + "/" + zone + "/" + strconv.FormatUint(n, 10), nil
}

// awsValue checks an EC2 instance ID: i- and 8 or 17 lower-case hex
// digits (upper case is lowered).
func awsValue(v string) (string, error) {
	v = strings.ToLower(v)
	digits, ok := strings.CutPrefix(v, "i-")
	if !ok || (len(digits) != 8 && len(digits) != 17) || !onlyRunes(digits, "0123456789abcdef") {
		return "", fmt.Errorf("%q is not an EC2 instance ID (i- and 8 or 17 hex digits)", v)
	}
	return v, nil
}

func onlyRunes(v, allowed string) bool {
	return v != "" && strings.Trim(v, allowed) == ""
}

// nodeValue accepts a Kubernetes node name (a DNS-1123 subdomain).
func nodeValue(v string) (string, error) {
	if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
		return "", errors.New(strings.Join(msgs, "; "))
	}
	return v, nil
}

// DeniesAny returns the entry that refuses any of identities (every
// identity the caller's evidence proves, attestation.Result.Identities)
// or nodeName ("" for a request without a node name), if any.
func (d DenyList) DeniesAny(identities []string, nodeName string) (string, bool) {
	for _, id := range identities {
		if id != "" && d.entries[id] {
			return id, true
		}
	}
	if nodeName != "" && d.entries[prefixNode+nodeName] {
		return prefixNode + nodeName, true
	}
	return "", false
}

// Len returns the number of entries.
func (d DenyList) Len() int { return len(d.entries) }
