package tpm_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-eventlog/testdata"
	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"google.golang.org/protobuf/encoding/protowire"
	"sigs.k8s.io/yaml"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

// ubuntuPCRs are the SHA-256 PCR values go-eventlog recorded with its
// real event log of a Compute Engine Ubuntu 24.04 SEV-SNP VM (Secure Boot,
// shim, GRUB; testdata.Ubuntu2404AmdSevSnpEventLog, values from its
// extract/extract_test.go, getTPMELEvents).
var ubuntuPCRs = map[uint32]string{
	0:  "50597a27846e91d025eef597abbc89f72bff9af849094db97b0684d8bc4c515e",
	1:  "57344e1cc8c6619413df33013a7cd67915459f967395af41db21c1fa7ca9c307",
	2:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
	3:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
	4:  "abe8b3fa6aecb36c2fd93c6f6edde661c21b353d007410a2739d69bfa7e1b9be",
	5:  "0b0e1903aeb1bff649b82dba2cdcf5c4ffb75027e54f151ab00b3b989f16a300",
	6:  "3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
	7:  "33ad69850fb2c7f30b4f8b4bc10ed93fc954dc07fa726e84f50f3d192dc1c140",
	8:  "6932a3f71dc55ad3c1a6ac2196eeac26a1b7164b6bbfa106625d94088ec3ecc3",
	9:  "ce08798b283c7a0ddc5e9ad1d602304b945b741fc60c20e254eafa0f4782512b",
	14: "306f9d8b94f17d93dc6e7cf8f5c79d652eb4c6c4d13de2dddc24af416e13ecaf",
}

// ubuntuSelection quotes every PCR the Ubuntu log extends, and the node
// lock PCR, which it does not.
var ubuntuSelection = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 14, 15}

// logNode is a simulator TPM whose PCRs a boot described by a TCG event
// log extended, and an attester sending that log, read from a file.
type logNode struct {
	tpm      io.ReadWriter
	logPath  string
	attester *tpmattester.QuoteAttester
	pcrs     []int
}

// bootWithLog extends the SHA-256 digest of every event of log into its
// PCR of a fresh simulator TPM, as the firmware, boot loader and kernel
// did on the machine that wrote it, so the quote of those PCRs is what
// that machine's TPM would quote.
func bootWithLog(t testing.TB, log []byte, pcrs []int) *logNode {
	t.Helper()
	rw := newSimulator(t)
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range el.Events(register.HashSHA256) {
		if e.Type == tcg.NoAction || !slices.Contains(pcrs, e.Index) {
			continue
		}
		if err := tpm2.PCRExtend(rw, tpmutil.Handle(e.Index), tpm2.AlgSHA256, e.Digest, ""); err != nil {
			t.Fatalf("extending PCR %d: %v", e.Index, err)
		}
	}
	path := filepath.Join(t.TempDir(), "binary_bios_measurements")
	if err := os.WriteFile(path, log, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: pcrs, TCGEventLogPath: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return &logNode{tpm: rw, logPath: path, attester: a, pcrs: pcrs}
}

// verifier returns a verifier pinning n's AK with ref as reference values.
func (n *logNode) verifier(t testing.TB, ref measurements.M, requireLog bool) *tpm.QuoteVerifier {
	t.Helper()
	v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{
		PCRs: n.pcrs, ReferenceValues: ref, RequireEventLog: requireLog,
		Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{n.attester.AttestationKey()}},
	}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (n *logNode) attest(t testing.TB, nonce []byte) []byte {
	t.Helper()
	evidence, err := n.attester.Attest(context.Background(), []byte("key hash"), nonce)
	if err != nil {
		t.Fatal(err)
	}
	return evidence
}

func decodeHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRealEventLogReplays(t *testing.T) {
	node := bootWithLog(t, testdata.Ubuntu2404AmdSevSnpEventLog, ubuntuSelection)
	// The simulator's PCRs, extended from the log, are the real machine's.
	read, err := client.ReadPCRs(node.tpm, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: ubuntuSelection})
	if err != nil {
		t.Fatal(err)
	}
	ref := measurements.M{}
	for index, want := range ubuntuPCRs {
		if got := read.GetPcrs()[index]; !bytes.Equal(got, decodeHex(t, want)) {
			t.Fatalf("PCR %d: simulator has %x after the log's extensions, the machine recorded %s", index, got, want)
		}
		ref[index] = measurements.Measurement{Expected: decodeHex(t, want)}
	}
	nonce := newNonce(t)
	result, err := node.verifier(t, ref, true).Verify(context.Background(), node.attest(t, nonce), nonce)
	if err != nil {
		t.Fatalf("verifying a real log with its quote: %v", err)
	}
	if len(result.BootEvents) < 50 {
		t.Fatalf("%d boot events, want the log's", len(result.BootEvents))
	}
	var cmdline, secureBoot, calling bool
	for i, e := range result.BootEvents {
		if i > 0 && e.Number <= result.BootEvents[i-1].Number {
			t.Errorf("event %d numbered %d after %d: not in log order", i, e.Number, result.BootEvents[i-1].Number)
		}
		if !slices.Contains(ubuntuSelection, int(e.PCR)) || len(e.Digest) != sha256.Size {
			t.Errorf("event %+v: PCR not quoted or digest not SHA-256", e)
		}
		switch {
		case e.PCR == 8 && e.Type == "EV_IPL" && strings.HasPrefix(e.Description, "kernel_cmdline: "+strings.TrimSuffix(testdata.Ubuntu2404AmdSevSnpCmdline, "\x00")):
			cmdline = true
		case e.PCR == 7 && e.Type == "EV_EFI_VARIABLE_DRIVER_CONFIG" && e.Description == "SecureBoot":
			secureBoot = true
		case e.PCR == 4 && e.Type == "EV_EFI_ACTION" && e.Description == tcg.CallingEFIApplication:
			calling = true
		}
	}
	if !cmdline || !secureBoot || !calling {
		t.Errorf("described events found: GRUB's kernel_cmdline %t, SecureBoot %t, %q %t; events: %+v",
			cmdline, secureBoot, tcg.CallingEFIApplication, calling, result.BootEvents)
	}
}

// ovmfUKILog is a real boot of a UKI under QEMU, OVMF and swtpm
// (testdata/README.md): the boot chain of the node image.
func ovmfUKILog(t testing.TB) []byte {
	t.Helper()
	return readTestdata(t, "qemu-ovmf-uki-eventlog.bin")
}

// ovmfSelection quotes every PCR the OVMF boot extends, and the node lock.
var ovmfSelection = []int{0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 15}

// TestRealUKIBootNamesTheCommandLine: the events of a real UKI boot
// replay to its quote and are described as systemd-stub and OVMF logged
// them; reference values expecting another command line name the
// .cmdline event.
func TestRealUKIBootNamesTheCommandLine(t *testing.T) {
	log := ovmfUKILog(t)
	node := bootWithLog(t, log, ovmfSelection)
	nonce := newNonce(t)
	evidence := node.attest(t, nonce)
	result, err := node.verifier(t, nil, true).Verify(context.Background(), evidence, nonce)
	if err != nil {
		t.Fatal(err)
	}
	var pcr11 []measurements.Event
	var described []string
	for _, e := range result.BootEvents {
		described = append(described, fmt.Sprintf("%d %d %s %s", e.Number, e.PCR, e.Type, e.Description))
		if e.PCR == 11 {
			pcr11 = append(pcr11, measurements.Event{Type: e.Type, Description: e.Description, Digest: e.Digest, Source: "uki.efi section " + e.Description})
		}
	}
	for _, want := range []string{
		"4 7 EV_EFI_VARIABLE_DRIVER_CONFIG SecureBoot", "10 1 EV_EFI_VARIABLE_BOOT BootOrder",
		"23 4 EV_EFI_BOOT_SERVICES_APPLICATION \\EFI\\BOOT\\BOOTX64.EFI", "29 11 EV_IPL .cmdline",
		"34 9 EV_EVENT_TAG Linux initrd", "35 5 EV_EFI_ACTION Exit Boot Services Invocation",
	} {
		if !slices.Contains(described, want) {
			t.Errorf("no event %q among:\n%s", want, strings.Join(described, "\n"))
		}
	}
	if len(pcr11) != 8 {
		t.Fatalf("%d PCR 11 events, want systemd-stub's 8 (4 sections, name and contents)", len(pcr11))
	}
	got := pcr11[5].Digest
	pcr11[5].Digest = sum([]byte("root=PARTUUID=1 gatehouse.role=worker"))
	ref := measurements.M{11: {Expected: bytes.Repeat([]byte{11}, 32), Events: pcr11}}
	_, err = node.verifier(t, ref, true).Verify(context.Background(), evidence, nonce)
	want := `PCR 11: event 29 EV_IPL ".cmdline": digest ` + hex.EncodeToString(got[:8]) + "… expected " + hex.EncodeToString(pcr11[5].Digest[:8]) + "… (uki.efi section .cmdline)"
	if !errors.Is(err, attestation.ErrMeasurement) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Verify: %v\nwant a refusal naming %s", err, want)
	}
}

// firstEvent returns the first event of log in PCR pcr whose type is typ.
func firstEvent(t testing.TB, log []byte, pcr int, typ tcg.EventType) tcg.Event {
	t.Helper()
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range el.Events(register.HashSHA256) {
		if e.Index == pcr && e.Type == typ {
			return e
		}
	}
	t.Fatalf("no %s event in PCR %d", typ.TCGString(), pcr)
	return tcg.Event{}
}

func TestTCGEventLogAttacks(t *testing.T) {
	real := testdata.Ubuntu2404AmdSevSnpEventLog
	node := bootWithLog(t, real, ubuntuSelection)
	// One digest changed after the quote: GRUB's kernel command line.
	cmdline := firstEvent(t, real, 8, tcg.Ipl)
	edited := bytes.Clone(real)
	at := bytes.Index(edited, cmdline.Digest)
	if at < 0 || bytes.Count(edited, cmdline.Digest) != 1 {
		t.Fatal("the kernel command line's digest is not once in the log")
	}
	edited[at] ^= 1
	sha384Only := synthesize(t, []tpm2.Algorithm{tpm2.AlgSHA384}, ukiBoot("console=ttyS0"))
	tests := []struct {
		name       string
		log        []byte
		requireLog bool
		want       error
		wantMsg    string
	}{
		{"the log as written replays", real, true, nil, ""},
		{"no log where the policy requires one", nil, true, attestation.ErrPolicy, "requires the TCG event log"},
		{"no log where the policy does not require one", nil, false, nil, ""},
		{"a log edited after the quote (one digest changed) names its PCR", edited, false, attestation.ErrPolicy, "does not replay to the quoted value of PCR 8:"},
		{"a log cut in the middle of an event", real[:len(real)-7], false, attestation.ErrMalformed, "parsing the TCG event log"},
		{"a log that ends before its last events", truncatedAtEvent(t, real), false, attestation.ErrPolicy, "does not replay to the quoted value of PCR"},
		{"another machine's log", testdata.ArchLinuxWorkstationEventLog, false, attestation.ErrPolicy, "does not replay to the quoted value of PCR 0, 1, 2, 4, 5, 7, 8"},
		{"a log for the SHA-1 bank only (TPM 1.2 format)", testdata.Debian10EventLog, false, attestation.ErrPolicy, "records SHA1 digests, no SHA-256"},
		{"a log for the SHA-384 bank only", sha384Only, false, attestation.ErrPolicy, "records SHA384 digests, no SHA-256"},
		{"a log over the size limit", append(bytes.Clone(real), make([]byte, tpm.MaxTCGEventLogSize)...), false, attestation.ErrMalformed, "at most"},
	}
	nonce := newNonce(t)
	evidence := node.attest(t, nonce)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forged := mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { ev.TcgEventLog = tt.log })
			_, err := node.verifier(t, nil, tt.requireLog).Verify(context.Background(), forged, nonce)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("Verify error = %v, want %v containing %q", err, tt.want, tt.wantMsg)
			}
		})
	}
}

// TestEvidenceWithTheLogTwiceIsRefused: the verifier takes the log out of
// the evidence without copying it; a second log field is malformed, not a
// choice between two logs.
func TestEvidenceWithTheLogTwiceIsRefused(t *testing.T) {
	node := bootWithLog(t, ovmfUKILog(t), ovmfSelection)
	nonce := newNonce(t)
	evidence := node.attest(t, nonce)
	v := node.verifier(t, nil, true)
	if _, err := v.Verify(context.Background(), evidence, nonce); err != nil {
		t.Fatal(err)
	}
	twice := protowire.AppendBytes(protowire.AppendTag(bytes.Clone(evidence), 10, protowire.BytesType), ovmfUKILog(t))
	if _, err := v.Verify(context.Background(), twice, nonce); !errors.Is(err, attestation.ErrMalformed) || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("evidence with the log twice: %v, want ErrMalformed", err)
	}
	wrongType := protowire.AppendVarint(protowire.AppendTag(bytes.Clone(evidence), 10, protowire.VarintType), 1)
	if _, err := v.Verify(context.Background(), wrongType, nonce); !errors.Is(err, attestation.ErrMalformed) {
		t.Fatalf("evidence with a number where the log goes: %v, want ErrMalformed", err)
	}
}

// truncatedAtEvent returns log without its last event: parsing it
// succeeds, replaying its last event's PCR fails.
func truncatedAtEvent(t testing.TB, log []byte) []byte {
	t.Helper()
	for cut := len(log) - 8; cut > 0; cut-- {
		short := log[:cut]
		el, err := tcg.ParseEventLog(short, tcg.ParseOpts{})
		if err == nil && len(el.Events(register.HashSHA256)) > 1 {
			return short
		}
	}
	t.Fatal("no event boundary found")
	return nil
}

func TestAttesterReadsTheLogAfresh(t *testing.T) {
	node := bootWithLog(t, testdata.Ubuntu2404AmdSevSnpEventLog, ubuntuSelection)
	v := node.verifier(t, nil, true)
	nonce := newNonce(t)
	if _, err := v.Verify(context.Background(), node.attest(t, nonce), nonce); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(node.logPath, testdata.ArchLinuxWorkstationEventLog, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), node.attest(t, nonce), nonce); !errors.Is(err, attestation.ErrPolicy) {
		t.Fatalf("evidence after the log file changed: %v, want the new log, which does not replay", err)
	}
	if err := os.Remove(node.logPath); err != nil {
		t.Fatal(err)
	}
	if _, err := node.attester.Attest(context.Background(), nil, nonce); err == nil || !strings.Contains(err.Error(), "reading the TCG event log") {
		t.Fatalf("Attest without the log file: %v, want an error naming it", err)
	}
	if err := os.WriteFile(node.logPath, make([]byte, tpm.MaxTCGEventLogSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := node.attester.Attest(context.Background(), nil, nonce); err == nil || !strings.Contains(err.Error(), "more than evidence can carry") {
		t.Fatalf("Attest with an oversized log: %v, want an error saying so", err)
	}
}

func TestRefusalNamesTheEvent(t *testing.T) {
	booted := ukiBoot("root=PARTUUID=1 gatehouse.role=controlPlane")
	worker := ukiBoot("root=PARTUUID=1 gatehouse.role=worker")
	log := synthesize(t, []tpm2.Algorithm{tpm2.AlgSHA1, tpm2.AlgSHA256}, booted)
	node := bootWithLog(t, log, []int{4, 9, 11, 15})
	nonce := newNonce(t)
	evidence := node.attest(t, nonce)
	withEvents := func(pcr uint32, events []measurements.Event) measurements.M {
		var boot []event
		for _, e := range events {
			boot = append(boot, event{pcr: pcr, digest: e.Digest})
		}
		return measurements.M{pcr: {Expected: replayed(boot, pcr), Events: events}}
	}
	cmdlineGot, cmdlineWant := booted[8].digest, worker[8].digest // event 9: the Spec ID event is 0
	tests := []struct {
		name string
		ref  measurements.M
		want string
	}{
		{
			"the kernel command line differs",
			withEvents(11, expectedEvents(worker, 11)),
			`PCR 11: event 9 EV_IPL ".cmdline": digest ` + hex.EncodeToString(cmdlineGot[:8]) + "… expected " + hex.EncodeToString(cmdlineWant[:8]) + "… (uki.efi section .cmdline)",
		},
		{
			"an event the reference value does not expect",
			withEvents(11, expectedEvents(booted, 11)[:6]),
			`PCR 11: event 10 EV_IPL ".initrd" digest ` + hex.EncodeToString(booted[9].digest[:8]) + "… is extra: the reference value expects 6 events",
		},
		{
			"an expected event the log lacks",
			withEvents(11, append(expectedEvents(booted, 11), measurements.Event{Type: "EV_IPL", Description: ".splash", Digest: sum([]byte("splash")), Source: "uki.efi section .splash"})),
			`PCR 11: the event log has 8 events for it, the reference value expects 9: missing EV_IPL ".splash" digest`,
		},
		{
			"an event of another type",
			withEvents(4, append([]measurements.Event{{Type: "EV_EFI_VARIABLE_BOOT", Description: "BootOrder", Digest: sum([]byte("0000"))}}, expectedEvents(booted, 4)...)),
			`PCR 4: event 1 EV_EFI_ACTION "Calling EFI Application from Boot Option": expected EV_EFI_VARIABLE_BOOT "BootOrder" digest`,
		},
		{
			"no expected events: the events behind the PCR",
			measurements.M{11: {Expected: make([]byte, 32)}},
			`PCR 11: the event log's 8 events behind it (the reference value names none to compare): event 4 EV_IPL ".linux" digest `,
		},
		{
			"a PCR the log records nothing for",
			measurements.M{9: {Expected: bytes.Repeat([]byte{9}, 32)}},
			"PCR 9: the event log records no event for it",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := node.verifier(t, tt.ref, false).Verify(context.Background(), evidence, nonce)
			if !errors.Is(err, attestation.ErrMeasurement) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Verify error = %v\nwant ErrMeasurement naming %s", err, tt.want)
			}
		})
	}
	t.Run("the UKI's image path is described", func(t *testing.T) {
		result, err := node.verifier(t, nil, true).Verify(context.Background(), evidence, nonce)
		if err != nil {
			t.Fatal(err)
		}
		if e := result.BootEvents[2]; e.Type != "EV_EFI_BOOT_SERVICES_APPLICATION" || e.Description != `\EFI\BOOT\BOOTX64.EFI` {
			t.Fatalf("event 3 = %+v, want the UKI's path", e)
		}
	})
	t.Run("without a log the refusal names no event", func(t *testing.T) {
		bare := mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { ev.TcgEventLog = nil })
		_, err := node.verifier(t, withEvents(11, expectedEvents(worker, 11)), false).Verify(context.Background(), bare, nonce)
		if !errors.Is(err, attestation.ErrMeasurement) || strings.Contains(err.Error(), "event log") {
			t.Fatalf("Verify error = %v, want a mismatch without events", err)
		}
	})
}

// TestRealLogRefusalNamesGRUBsCommandLine: reference values listing a real
// machine's PCR 8 events with another kernel command line name GRUB's
// kernel_cmdline event.
func TestRealLogRefusalNamesGRUBsCommandLine(t *testing.T) {
	real := testdata.Ubuntu2404AmdSevSnpEventLog
	node := bootWithLog(t, real, ubuntuSelection)
	el, err := tcg.ParseEventLog(real, tcg.ParseOpts{})
	if err != nil {
		t.Fatal(err)
	}
	var expected []measurements.Event
	for _, e := range el.Events(register.HashSHA256) {
		if e.Index == 8 {
			expected = append(expected, measurements.Event{Type: e.Type.TCGString(), Digest: e.Digest})
		}
	}
	other := sum([]byte("kernel_cmdline: /vmlinuz root=/dev/sda1 init=/bin/sh"))
	var number uint32
	for i, e := range el.Events(register.HashSHA256) {
		if e.Index == 8 && e.Type == tcg.Ipl && strings.Contains(string(e.Data), "kernel_cmdline") {
			number = uint32(i) + 1 // the Spec ID event is 0
			for j := range expected {
				if bytes.Equal(expected[j].Digest, e.Digest) {
					expected[j].Digest, expected[j].Source = other, "the image's grub.cfg"
				}
			}
		}
	}
	ref := measurements.M{8: {Expected: bytes.Repeat([]byte{8}, 32), Events: expected}}
	nonce := newNonce(t)
	_, err = node.verifier(t, ref, true).Verify(context.Background(), node.attest(t, nonce), nonce)
	want := "PCR 8: event " + strconv.Itoa(int(number)) + ` EV_IPL "kernel_cmdline: /vmlinuz-6.8.0-1010-gcp root=PARTUUID=`
	if !errors.Is(err, attestation.ErrMeasurement) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "(the image's grub.cfg)") {
		t.Fatalf("Verify error = %v\nwant one naming %s", err, want)
	}
}

// TestRoleRefusalNamesTheEvent: a policy whose roles differ in the
// kernel command line refuses a node booted with the other role's,
// naming the .cmdline event, and requires the log by default since its
// reference values list events.
func TestRoleRefusalNamesTheEvent(t *testing.T) {
	controlPlane := ukiBoot("root=PARTUUID=1 gatehouse.role=controlPlane")
	worker := ukiBoot("root=PARTUUID=1 gatehouse.role=worker")
	node := bootWithLog(t, synthesize(t, []tpm2.Algorithm{tpm2.AlgSHA256}, controlPlane), []int{4, 9, 11, 15})
	spki, err := x509.MarshalPKIXPublicKey(node.attester.AttestationKey())
	if err != nil {
		t.Fatal(err)
	}
	role := func(boot []event) policy.RolePolicy {
		m := measurements.M{11: {Expected: replayed(boot, 11), Events: expectedEvents(boot, 11)}}
		y, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		j, err := yaml.YAMLToJSON(y)
		if err != nil {
			t.Fatal(err)
		}
		return policy.RolePolicy{ReferenceValues: j}
	}
	p := policy.Policy{
		Variant: "tpm", PCRs: []int{4, 9, 11, 15},
		PinnedAKs: []string{string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}))},
		Roles:     map[policy.Role]policy.RolePolicy{policy.RoleControlPlane: role(controlPlane), policy.RoleWorker: role(worker)},
	}
	appraisal, err := p.Appraisal(time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(appraisal.Summary, "requireEventLog=true") {
		t.Errorf("summary %q: reference values listing events require the log", appraisal.Summary)
	}
	asWorker, err := appraisal.ForRole(policy.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	nonce := newNonce(t)
	evidence := node.attest(t, nonce)
	_, err = asWorker.Verify(context.Background(), evidence, nonce)
	want := `role worker: measurements differ from the reference values: index 11: expected ` + hex.EncodeToString(replayed(worker, 11)) +
		", got " + hex.EncodeToString(replayed(controlPlane, 11)) + `; the TCG event log shows: PCR 11: event 9 EV_IPL ".cmdline": digest ` +
		hex.EncodeToString(controlPlane[8].digest[:8]) + "… expected " + hex.EncodeToString(worker[8].digest[:8]) + "… (uki.efi section .cmdline)"
	if !errors.Is(err, attestation.ErrMeasurement) || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("Verify as a worker: %v\nwant the refusal ending %s", err, want)
	}
	result, err := appraisal.Verify(context.Background(), evidence, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if roles := appraisal.Roles(result.Measurements); !slices.Equal(roles, []policy.Role{policy.RoleControlPlane}) {
		t.Fatalf("roles %v, want controlPlane", roles)
	}
	bare := mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { ev.TcgEventLog = nil })
	if _, err := appraisal.Verify(context.Background(), bare, nonce); !errors.Is(err, attestation.ErrPolicy) || !strings.Contains(err.Error(), "requireEventLog") {
		t.Fatalf("evidence without its log: %v, want the policy's requirement", err)
	}
}
