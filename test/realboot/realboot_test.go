// Package realboot boots the Gatehouse node image for real: QEMU with
// Debian's OVMF measuring the boot into a swtpm TPM whose endorsement key a
// local manufacturer CA certified, the image's UKI, its dm-verity root and
// the bootstrapper it starts (docs/image.md, "Boots for real").
//
// It needs the image `make test` builds (GATEHOUSE_NODE_IMAGE, from
// hack/node-image.sh) and runs about four boots under TCG emulation.
package realboot

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/bootstrapper/statedisk"
	"github.com/gatehouse-dev/gatehouse/image/qemu"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/testenv"
	"github.com/gatehouse-dev/gatehouse/mini"
)

// bootTimeout bounds one boot to the bootstrapper's first words under TCG
// on a busy machine (OVMF alone takes about a minute there).
const bootTimeout = 8 * time.Minute

// initPort is the bootstrapper's InitService (and RecoveryService) port in
// the image.
const initPort = 9000

// listening is the bootstrapper's line once its InitService (or, on an
// initialised disk, its RecoveryService) listens — and no other unit's:
// gatehouse-kms.service also logs "Waiting for" while it waits for its keys.
var listening = regexp.MustCompile(`gatehouse-bootstrapper.*("Serving RecoveryService|"Waiting for init or join","initAddress")`)

// rig is what every boot of the test shares: the image, the CLI, the
// TPM manufacturer, and the cluster configuration made from the image's
// signed reference values.
type rig struct {
	image  testenv.NodeImage
	cli    string
	ca     swtpm.LocalCA
	config string
	secret string // master secret file
	work   string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	image, err := testenv.NodeImageDir()
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{image: image, cli: testenv.BuildBinary(t, "github.com/gatehouse-dev/gatehouse/cmd/gatehouse"), work: t.TempDir()}
	r.ca = swtpm.LocalCA{Dir: filepath.Join(r.work, "tpm-ca")}
	if err := r.ca.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	root, intermediate, err := r.ca.Roots()
	if err != nil {
		t.Fatal(err)
	}
	roots, inter := r.file(t, "ek-roots.pem", root), r.file(t, "ek-intermediates.pem", intermediate)
	r.config = filepath.Join(r.work, "gatehouse.yaml")
	r.run(t, "config", "generate", "--output", r.config,
		"--reference-values-from", image.SignedValues, "--verify-key", image.VerifyKey,
		"--ek-roots", roots, "--ek-intermediates", inter)
	master, salt := make([]byte, 32), make([]byte, 32)
	_, _ = rand.Read(master)
	_, _ = rand.Read(salt)
	data, err := json.Marshal(map[string][]byte{"key": master, "salt": salt})
	if err != nil {
		t.Fatal(err)
	}
	r.secret = r.file(t, "master-secret.json", data)
	return r
}

func (r *rig) file(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(r.work, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// run runs the CLI and returns its output, failing the test on an error.
func (r *rig) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := r.try(t, args...)
	if err != nil {
		t.Fatalf("gatehouse %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// try runs the CLI and returns its output and error.
func (r *rig) try(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.cli, args...).CombinedOutput()
	return string(out), err
}

// boot starts a VM of disk in dir and waits for the bootstrapper to listen.
func (r *rig) boot(t *testing.T, disk, dir string) *qemu.VM {
	t.Helper()
	vm, err := qemu.Start(t.Context(), qemu.Config{
		// OVMF measures a firmware volume whose digest depends on the
		// memory size into PCR 0, and platform qemu-ovmf was measured so.
		Image: disk, Dir: dir, StateDiskSize: 1 << 30, TPMCA: r.ca, MemoryMiB: mini.VMMemoryMiB,
		Forwards: []qemu.Forward{{Guest: initPort}},
		Log:      slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logConsoleTail(t, vm.ConsoleLog())
		}
		if err := vm.Stop(context.Background()); err != nil {
			t.Errorf("stopping the VM: %v", err)
		}
	})
	return vm
}

// waitFor waits for re on the VM's console within one boot's time.
// logConsoleTail logs the last lines of a failed test's VM console:
// the test's directory is gone once it ends, and CI keeps only the log.
func logConsoleTail(t *testing.T, path string) {
	t.Helper()
	const lines = 60
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("reading the console %s: %v", path, err)
		return
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	all = all[max(0, len(all)-lines):]
	t.Logf("the last %d lines of the console %s:\n%s", len(all), path, strings.Join(all, "\n"))
}

func waitFor(t *testing.T, vm *qemu.VM, re *regexp.Regexp) qemu.Line {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), bootTimeout)
	defer cancel()
	line, err := vm.WaitForLine(ctx, re)
	if err != nil {
		t.Fatalf("waiting for %q on the console: %v (console: %s)", re, err, vm.ConsoleLog())
	}
	return line
}

func (r *rig) endpoint(vm *qemu.VM) string {
	for _, p := range vm.Ports() {
		if p.Guest == initPort {
			return fmt.Sprintf("127.0.0.1:%d", p.Host)
		}
	}
	return ""
}

// identity computes, before the VM's first boot, the attestation identity
// its TPM will prove: the TPM is manufactured into the VM's directory, and
// the AK (go-tpm-tools' template in the owner hierarchy) is the same key on
// every start of that TPM.
func (r *rig) identity(t *testing.T, vmDir string) string {
	t.Helper()
	stateDir := filepath.Join(vmDir, "tpm") // where image/qemu keeps the TPM of a VM directory (Config.Dir)
	if err := swtpm.Manufacture(t.Context(), stateDir, r.ca); err != nil {
		t.Fatal(err)
	}
	tpm, err := swtpm.Start(t.Context(), stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer tpm.Stop()
	rw, err := tpm.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: []int{15}})
	if err != nil {
		t.Fatal(err)
	}
	id, err := a.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// initialisedDisk makes the state disk a control plane of the rig's
// cluster would have: LUKS2 with the key gatehouse recover derives for
// identity and the disk's UUID, marked initialised with a measurement salt.
// It needs no device-mapper: nothing is opened here.
func (r *rig) initialisedDisk(t *testing.T, path, identity string) {
	t.Helper()
	ctx := t.Context()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	disk, err := statedisk.New(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := disk.Format(ctx, make([]byte, 32)); err != nil { // replaced below, once the UUID is known
		t.Fatal(err)
	}
	uuid, err := disk.UUID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var secret struct{ Key, Salt []byte }
	data, err := os.ReadFile(r.secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &secret); err != nil {
		t.Fatal(err)
	}
	cluster, err := kms.NewClusterKMS(secret.Key, secret.Salt)
	if err != nil {
		t.Fatal(err)
	}
	id, err := keys.DiskKeyID(identity, uuid)
	if err != nil {
		t.Fatal(err)
	}
	key, err := cluster.GetDataKey(ctx, id, keys.StateDiskKeySize)
	if err != nil {
		t.Fatal(err)
	}
	if err := disk.Rekey(ctx, make([]byte, 32), key); err != nil {
		t.Fatal(err)
	}
	salt := make([]byte, 32)
	_, _ = rand.Read(salt)
	if err := disk.MarkInitialised(ctx, salt); err != nil {
		t.Fatal(err)
	}
}

// TestRealBoot: the control-plane disk boots under OVMF with a real TPM;
// its evidence — quote, firmware event log — matches the reference values
// the build predicted and signed, under the policy `config generate` made
// from the signed file. `gatehouse recover` then unlocks its state disk
// with dm-crypt inside the VM; after a reset (firmware measuring again,
// PCRs from zero) the state written in the first boot is still there, and
// on the host the disk holds only ciphertext.
func TestRealBoot(t *testing.T) {
	r := newRig(t)
	vmDir := filepath.Join(r.work, "cp")
	identity := r.identity(t, vmDir)
	stateDisk := filepath.Join(vmDir, "state.raw")
	r.initialisedDisk(t, stateDisk, identity)

	vm := r.boot(t, r.image.ControlPlaneDisk, vmDir)
	waitFor(t, vm, listening)
	ep := r.endpoint(vm)

	out := r.run(t, "verify", "--config", r.config, "--node", ep, "--events")
	for _, want := range []string{identity, "controlPlane", ".cmdline", "EV_EFI_BOOT_SERVICES_APPLICATION"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify's report lacks %q:\n%s", want, out)
		}
	}

	out = r.run(t, "recover", "--config", r.config, "--master-secret-file", r.secret, "--endpoint", ep)
	if !strings.Contains(out, "recovered ("+identity+")") {
		t.Fatalf("recover: %s", out)
	}
	first := stateRecord(t, waitFor(t, vm, stateOpened))
	if first.opened != 1 {
		t.Fatalf("the first opening of the state disk counts %d boots", first.opened)
	}

	if err := vm.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, vm, listening) // the console is per boot: this is the new one's
	r.run(t, "recover", "--config", r.config, "--master-secret-file", r.secret, "--endpoint", ep)
	second := stateRecord(t, waitFor(t, vm, stateOpened))
	if second.createdInBoot != first.thisBoot || second.thisBoot == first.thisBoot || second.opened != 2 {
		t.Fatalf("after the reset the state disk says %+v; before it %+v: the state did not survive", second, first)
	}

	raw, err := os.ReadFile(stateDisk)
	if err != nil {
		t.Fatal(err)
	}
	// What lives only inside the encrypted file system: the record's name
	// and the boot ID it holds, ext4's lost+found. (The LUKS2 header's own
	// token type, "gatehouse-state", is plaintext by design.)
	for _, plain := range []string{first.thisBoot, "gatehouse-state.json", "lost+found"} {
		if bytes.Contains(raw, []byte(plain)) {
			t.Errorf("the state disk's bytes on the host contain %q: not ciphertext", plain)
		}
	}
}

// stateOpened is the bootstrapper's line once it opened the state disk.
var stateOpened = regexp.MustCompile(`The state disk is open and holds the node's state`)

type record struct {
	createdInBoot, thisBoot string
	opened                  int
}

// stateRecord reads the record fields from the bootstrapper's JSON log line.
func stateRecord(t *testing.T, line qemu.Line) record {
	t.Helper()
	field := func(name string) string {
		m := regexp.MustCompile(`"` + name + `":"?([^",}]*)`).FindStringSubmatch(line.Text)
		if m == nil {
			t.Fatalf("%q lacks %s", line.Text, name)
		}
		return m[1]
	}
	var n int
	if _, err := fmt.Sscan(field("bootsOpened"), &n); err != nil {
		t.Fatal(err)
	}
	return record{createdInBoot: field("createdInBoot"), thisBoot: field("thisBoot"), opened: n}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
