package predict

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// bootChainFile is the data table of the boot chain inside the UKI
// (bootchain.yaml): the events systemd-stub and the Linux EFI stub add
// besides the stub's PCR 11 sections, each marked measured or not with the
// reason, so that a real boot's event log can correct it without code.
//
//go:embed bootchain.yaml
var bootChainFile []byte

// bootChain is bootchain.yaml's content.
type bootChain struct {
	Name      string       `json:"name"`
	Events    []chainEvent `json:"events"`
	Untouched []untouched  `json:"untouched"`
}

// chainEvent is one event the boot chain may extend.
type chainEvent struct {
	PCR         uint32 `json:"pcr"`
	Type        string `json:"type"`
	Description string `json:"description"`
	// DigestOf says what is hashed: "initrd" (the .initrd section as
	// handed to the kernel), "load-options" (the command line systemd-stub
	// passes as the kernel's LoadOptions: the .cmdline section with
	// control characters as spaces and trailing spaces removed, UTF-16LE
	// with its NUL), "linux-authenticode" (the .linux section's Authenticode
	// SHA-256) or "text" (Text's bytes, as systemd-pcrphase extends a word).
	DigestOf string `json:"digestOf"`
	Text     string `json:"text,omitempty"`
	Measured bool   `json:"measured"`
	// SecureBoot, when "on" or "off", limits the event to platforms with
	// Secure Boot in that state (a platform profile's secureBoot).
	SecureBoot string `json:"secureBoot,omitempty"`
	Why        string `json:"why"`
}

// appliesTo reports whether e happens on a platform whose Secure Boot is
// on (secureBoot) or off.
func (e chainEvent) appliesTo(secureBoot bool) bool {
	return e.SecureBoot == "" || (e.SecureBoot == "on") == secureBoot
}

// untouched is a PCR the boot chain leaves at zero.
type untouched struct {
	PCR uint32 `json:"pcr"`
	Why string `json:"why"`
}

// loadBootChain parses the embedded table strictly.
func loadBootChain() (bootChain, error) {
	jsonData, err := yaml.YAMLToJSONStrict(bootChainFile)
	if err != nil {
		return bootChain{}, fmt.Errorf("bootchain.yaml: %w", err)
	}
	var c bootChain
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return bootChain{}, fmt.Errorf("bootchain.yaml: %w", err)
	}
	for i, e := range c.Events {
		if e.SecureBoot != "" && e.SecureBoot != "on" && e.SecureBoot != "off" {
			return bootChain{}, fmt.Errorf("bootchain.yaml: events[%d]: secureBoot %q: want on, off or nothing", i, e.SecureBoot)
		}
		switch e.DigestOf {
		case "initrd", "load-options", "linux-authenticode":
		case "text":
			if e.Text == "" {
				return bootChain{}, fmt.Errorf("bootchain.yaml: events[%d]: digestOf text needs text", i)
			}
		default:
			return bootChain{}, fmt.Errorf("bootchain.yaml: events[%d]: digestOf %q: want initrd, load-options, linux-authenticode or text", i, e.DigestOf)
		}
	}
	return c, nil
}

// digest returns the SHA-256 an event of the chain extends for u, with a
// sentence saying where it came from.
func (e chainEvent) digest(u *uki) ([]byte, string, error) {
	switch e.DigestOf {
	case "initrd":
		initrd, ok := u.sections[".initrd"]
		if !ok {
			return nil, "", fmt.Errorf("%s has no .initrd section, whose measurement (%s %q) the boot chain expects", u.name, e.Type, e.Description)
		}
		sum := sha256.Sum256(initrd)
		return sum[:], fmt.Sprintf("%s section .initrd (sha256 of %d bytes), measured by the Linux EFI stub", u.name, len(initrd)), nil
	case "load-options":
		cmdline, ok := u.sections[".cmdline"]
		if !ok {
			return nil, "", fmt.Errorf("%s has no .cmdline section: the kernel's command line would come from the boot option, which is not predicted; build the UKI with one", u.name)
		}
		options, err := loadOptions(cmdline)
		if err != nil {
			return nil, "", fmt.Errorf("%s section .cmdline: %w", u.name, err)
		}
		sum := sha256.Sum256(options)
		return sum[:], fmt.Sprintf("%s section .cmdline as systemd-stub's LoadOptions (sha256 of %d bytes of UTF-16LE)", u.name, len(options)), nil
	case "linux-authenticode":
		digest, err := authenticode(u.sections[".linux"])
		if err != nil {
			return nil, "", fmt.Errorf("%s section .linux: %w", u.name, err)
		}
		return digest, fmt.Sprintf("%s section .linux Authenticode SHA-256", u.name), nil
	default:
		sum := sha256.Sum256([]byte(e.Text))
		return sum[:], fmt.Sprintf("systemd-pcrphase word %q (sha256 of %d bytes)", e.Text, len(e.Text)), nil
	}
}

// loadOptions is the command line systemd-stub 252 gives the kernel as
// LoadOptions for a .cmdline section (src/boot/efi/stub.c, linux.c):
// converted to UTF-16 (xstrn8_to_16 stops at a NUL), control characters
// turned into spaces and trailing spaces removed (mangle_stub_cmdline),
// UTF-16LE with the terminating NUL (strsize16). The stub's conversion is
// to UCS-2: characters beyond the Basic Multilingual Plane are dropped, and
// invalid UTF-8 is refused here rather than guessed.
func loadOptions(cmdline []byte) ([]byte, error) {
	if i := bytes.IndexByte(cmdline, 0); i >= 0 {
		cmdline = cmdline[:i]
	}
	if !utf8.Valid(cmdline) {
		return nil, errors.New("the command line is not valid UTF-8, whose conversion by systemd-stub is not predicted")
	}
	chars := make([]uint16, 0, len(cmdline)+1)
	for _, r := range string(cmdline) {
		switch {
		case r <= 0x1f:
			r = ' '
		case r > 0xffff || (r >= 0xd800 && r <= 0xdfff):
			continue
		}
		chars = append(chars, uint16(r))
	}
	for len(chars) > 0 && chars[len(chars)-1] == ' ' {
		chars = chars[:len(chars)-1]
	}
	chars = append(chars, 0)
	out := make([]byte, 2*len(chars))
	for i, c := range chars {
		binary.LittleEndian.PutUint16(out[2*i:], c)
	}
	return out, nil
}
