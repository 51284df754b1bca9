// Package statedisk manages a node's LUKS2 state disk with the cryptsetup
// binary (cryptsetup(8), LUKS2 on-disk format spec): formatted with a
// random passphrase on first boot, re-keyed to the key derived from the
// cluster's master secret at init or join, and marked with a LUKS2 token
// saying whether it is initialised or marked for reset. Keys reach
// cryptsetup only through stdin or inherited pipe file descriptors, never
// through argv, the environment, a file or an error message.
package statedisk

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// keySize is the size of the random first-boot passphrase and of derived
// disk keys, in bytes.
const keySize = 32

// stateTokenID is the LUKS2 token slot holding the disk's Gatehouse state.
const stateTokenID = "7"

// stateTokenType is the LUKS2 token type of the state token.
const stateTokenType = "gatehouse-state"

// State is what the state token says about a disk.
type State string

const (
	// Unformatted means no LUKS2 header (a blank disk, or another format).
	Unformatted State = "unformatted"
	// fresh means formatted with a random passphrase, not yet initialised.
	fresh State = "fresh"
	// Initialised means re-keyed to the cluster's key at init or join.
	Initialised State = "initialised"
	// ResetRequested means marked to be formatted again at the next boot.
	ResetRequested State = "reset-requested"
)

// errWrongKey means cryptsetup found no key slot the given key opens.
var errWrongKey = errors.New("no key slot of the state disk accepts the key")

// Disk is one LUKS2 state disk, e.g. /dev/vdb or a loop device.
type Disk struct {
	device     string
	cryptsetup string
}

// New returns the disk at device, driven by the cryptsetup binary found in
// PATH.
func New(device string) (*Disk, error) {
	bin, err := exec.LookPath("cryptsetup")
	if err != nil {
		return nil, fmt.Errorf("state disk: cryptsetup not found (install Debian package cryptsetup-bin): %w", err)
	}
	return &Disk{device: device, cryptsetup: bin}, nil
}

// Device returns the block device path.
func (d *Disk) Device() string { return d.device }

// keyFDs hands secrets to a child process on pipes, as /dev/fd/3, 4, ….
type keyFDs struct {
	files []*os.File
}

// add returns the /dev/fd path under which the child reads key. The pipe
// is filled and closed for writing at once; a key is far smaller than a
// pipe's buffer.
func (k *keyFDs) add(key []byte) (string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	_, werr := w.Write(key)
	cerr := w.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = r.Close()
		return "", err
	}
	k.files = append(k.files, r)
	return fmt.Sprintf("/dev/fd/%d", 2+len(k.files)), nil
}

func (k *keyFDs) close() {
	for _, f := range k.files {
		_ = f.Close()
	}
}

// run runs cryptsetup with args, stdin (may be nil) and the key pipes;
// errors carry cryptsetup's message and exit code (cryptsetup(8) "RETURN
// CODES": 2 means no key slot accepted the key).
func (d *Disk) run(ctx context.Context, stdin []byte, keys *keyFDs, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, d.cryptsetup, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if keys != nil {
		cmd.ExtraFiles = keys.files
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	msg := strings.TrimSpace(stderr.String())
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 2 {
		return nil, fmt.Errorf("cryptsetup %s %s: %w (%s)", args[0], d.device, errWrongKey, msg)
	}
	return nil, fmt.Errorf("cryptsetup %s %s: %w: %s", args[0], d.device, err, msg)
}

// pbkdfArgs: every key is 32 random bytes, so the slow key derivation that
// protects human passphrases (argon2id, ~1 GiB, ~2 s) would add nothing but
// boot time and memory; PBKDF2 at cryptsetup's minimum count is used.
var pbkdfArgs = []string{"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"}

// Format writes a new LUKS2 header with key in its only key slot and a
// Fresh state token, destroying whatever the disk held.
func (d *Disk) Format(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	args := append([]string{"luksFormat", "--batch-mode", "--type", "luks2", "--key-file=-"}, pbkdfArgs...)
	if _, err := d.run(ctx, key, nil, append(args, d.device)...); err != nil {
		return fmt.Errorf("formatting the state disk: %w", err)
	}
	return d.setState(ctx, fresh, nil)
}

// FormatRandom formats the disk with a random passphrase (first boot) and
// returns it; the caller keeps it in memory until the disk is re-keyed.
func (d *Disk) FormatRandom(ctx context.Context) ([]byte, error) {
	key := make([]byte, keySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("generating the first-boot passphrase: %w", err)
	}
	return key, d.Format(ctx, key)
}

// State reads the disk's state: Unformatted without a LUKS header, else
// the state token's value (Fresh when the token is missing).
func (d *Disk) State(ctx context.Context) (State, error) {
	tok, err := d.readToken(ctx)
	if err != nil || tok == nil {
		return Unformatted, err
	}
	return State(tok.State), nil
}

// MeasurementSalt returns the cluster's measurement salt recorded by
// MarkInitialised; a rebooted node needs it to derive its cluster ID again.
func (d *Disk) MeasurementSalt(ctx context.Context) ([]byte, error) {
	tok, err := d.readToken(ctx)
	if err != nil {
		return nil, err
	}
	if tok == nil || State(tok.State) != Initialised {
		return nil, errors.New("the state disk is not initialised: it records no measurement salt")
	}
	salt, err := hex.DecodeString(tok.MeasurementSalt)
	if err != nil || len(salt) == 0 {
		return nil, fmt.Errorf("the state disk's %s token holds no valid measurement salt", stateTokenType)
	}
	return salt, nil
}

// readToken returns the state token; nil without a LUKS header, a Fresh
// token when the header has none.
func (d *Disk) readToken(ctx context.Context) (*stateToken, error) {
	if _, err := d.run(ctx, nil, nil, "isLuks", "--type", "luks2", d.device); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 1 {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the state disk header: %w", err)
	}
	out, err := d.run(ctx, nil, nil, "luksDump", "--dump-json-metadata", d.device)
	if err != nil {
		return nil, fmt.Errorf("reading the state disk header: %w", err)
	}
	var meta struct {
		Tokens map[string]stateToken `json:"tokens"`
	}
	if err := json.Unmarshal(out, &meta); err != nil {
		return nil, fmt.Errorf("reading the state disk header: %w", err)
	}
	tok, ok := meta.Tokens[stateTokenID]
	if !ok || tok.Type != stateTokenType {
		return &stateToken{Type: stateTokenType, State: string(fresh)}, nil
	}
	switch State(tok.State) {
	case fresh, Initialised, ResetRequested:
		return &tok, nil
	default:
		return nil, fmt.Errorf("the state disk's %s token says %q: not a known state", stateTokenType, tok.State)
	}
}

// stateToken is the LUKS2 token (LUKS2 spec, "tokens": type and keyslots
// are required) holding the Gatehouse state.
type stateToken struct {
	Type     string   `json:"type"`
	Keyslots []string `json:"keyslots"`
	State    string   `json:"state"`
	// MeasurementSalt is the cluster's measurement salt in hex (not secret).
	MeasurementSalt string `json:"measurementSalt,omitempty"`
}

func (d *Disk) setState(ctx context.Context, s State, salt []byte) error {
	tok, err := json.Marshal(stateToken{Type: stateTokenType, Keyslots: []string{}, State: string(s), MeasurementSalt: hex.EncodeToString(salt)})
	if err != nil {
		return err
	}
	if _, err := d.run(ctx, tok, nil, "token", "import", "--json-file=-", "--token-id", stateTokenID, "--token-replace", d.device); err != nil {
		return fmt.Errorf("marking the state disk %s: %w", s, err)
	}
	return nil
}

// MarkInitialised records that the disk holds the cluster's key, and the
// cluster's measurement salt.
func (d *Disk) MarkInitialised(ctx context.Context, measurementSalt []byte) error {
	if len(measurementSalt) == 0 {
		return errors.New("marking the state disk initialised: the measurement salt is empty")
	}
	return d.setState(ctx, Initialised, measurementSalt)
}

// MarkForReset asks the next boot to format the disk again (the node
// leaves its cluster, or its bootstrap failed after the node lock).
func (d *Disk) MarkForReset(ctx context.Context) error { return d.setState(ctx, ResetRequested, nil) }

// TestKey reports whether key opens a key slot (cryptsetup open
// --test-passphrase; needs no device-mapper).
func (d *Disk) TestKey(ctx context.Context, key []byte) (bool, error) {
	_, err := d.run(ctx, key, nil, "open", "--test-passphrase", "--key-file=-", d.device)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errWrongKey):
		return false, nil
	default:
		return false, fmt.Errorf("testing a state disk key: %w", err)
	}
}

// Rekey replaces oldKey with newKey: the new key is added, checked, and
// only then the old one removed, so at every moment one of them opens the
// disk. It is idempotent: when newKey already opens the disk (a re-key
// interrupted after adding it) only the old key is removed, if still there.
func (d *Disk) Rekey(ctx context.Context, oldKey, newKey []byte) error {
	if err := errors.Join(checkKey(oldKey), checkKey(newKey)); err != nil {
		return err
	}
	if bytes.Equal(oldKey, newKey) {
		return errors.New("re-keying the state disk: the new key equals the old one")
	}
	has, err := d.TestKey(ctx, newKey)
	if err != nil {
		return err
	}
	if !has {
		keys := &keyFDs{}
		defer keys.close()
		oldPath, err := keys.add(oldKey)
		if err != nil {
			return fmt.Errorf("re-keying the state disk: %w", err)
		}
		newPath, err := keys.add(newKey)
		if err != nil {
			return fmt.Errorf("re-keying the state disk: %w", err)
		}
		args := append([]string{"luksAddKey", "--batch-mode", "--key-file=" + oldPath}, pbkdfArgs...)
		if _, err := d.run(ctx, nil, keys, append(args, d.device, newPath)...); err != nil {
			return fmt.Errorf("re-keying the state disk: adding the new key: %w", err)
		}
		if ok, err := d.TestKey(ctx, newKey); err != nil {
			return fmt.Errorf("re-keying the state disk: checking the new key: %w", err)
		} else if !ok {
			return errors.New("re-keying the state disk: the new key does not open it after adding")
		}
	}
	if _, err := d.run(ctx, oldKey, nil, "luksRemoveKey", "--batch-mode", "--key-file=-", d.device); err != nil && !errors.Is(err, errWrongKey) {
		return fmt.Errorf("re-keying the state disk: removing the old key: %w", err)
	}
	return nil
}

// Open maps the disk to /dev/mapper/<name> with key. It needs a kernel
// with device-mapper (see DeviceMapperAvailable).
func (d *Disk) Open(ctx context.Context, name string, key []byte) error {
	if _, err := d.run(ctx, key, nil, "open", "--type", "luks2", "--key-file=-", d.device, name); err != nil {
		return fmt.Errorf("opening the state disk as %s: %w", name, err)
	}
	return nil
}

// Close unmaps /dev/mapper/<name>.
func (d *Disk) Close(ctx context.Context, name string) error {
	if _, err := d.run(ctx, nil, nil, "close", name); err != nil {
		return fmt.Errorf("closing the state disk mapping %s: %w", name, err)
	}
	return nil
}

// UUID returns the LUKS header's UUID, the disk UUID a join ticket's disk
// key is derived for.
func (d *Disk) UUID(ctx context.Context) (string, error) {
	out, err := d.run(ctx, nil, nil, "luksUUID", d.device)
	if err != nil {
		return "", fmt.Errorf("reading the state disk UUID: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// DeviceMapperAvailable reports whether the kernel offers device-mapper
// (listed in /proc/misc), which opening a LUKS disk needs; it returns why
// not otherwise.
func DeviceMapperAvailable() (bool, string) {
	misc, err := os.ReadFile("/proc/misc")
	if err != nil {
		return false, "cannot read /proc/misc: " + err.Error()
	}
	if !strings.Contains(string(misc), "device-mapper") {
		return false, "this kernel has no device-mapper (not in /proc/misc)"
	}
	if _, err := os.Stat("/dev/mapper/control"); err != nil {
		return false, "/dev/mapper/control is missing: " + err.Error()
	}
	return true, ""
}

func checkKey(key []byte) error {
	if len(key) == 0 {
		return errors.New("state disk key is empty")
	}
	return nil
}
