package predict

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-eventlog/testdata"

	"github.com/gatehouse-dev/gatehouse/image/predict/predicttest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
)

func TestEmbeddedPlatforms(t *testing.T) {
	for _, name := range knownPlatforms() {
		t.Run(name, func(t *testing.T) {
			p, err := embeddedPlatform(name)
			if err != nil {
				t.Fatal(err)
			}
			if p.name != name || p.description == "" || p.source == "" {
				t.Errorf("profile %s: name %q, description %q, source %q", name, p.name, p.description, p.source)
			}
			again, err := p.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if q, err := parsePlatform(again); err != nil || q.name != p.name || len(q.pcr4Before) != len(p.pcr4Before) {
				t.Errorf("marshalled profile does not parse back: %v\n%s", err, again)
			}
		})
	}
	p := qemuOVMF(t)
	if want := sum([]byte("Calling EFI Application from Boot Option")); len(p.pcr4Before) != 2 || !bytes.Equal(p.pcr4Before[0].Digest, want) ||
		!bytes.Equal(p.pcr4Before[1].Digest, sum([]byte{0, 0, 0, 0})) {
		t.Errorf("qemu-ovmf's PCR 4 events %+v: want the boot-option action and the separator", p.pcr4Before)
	}
	// The embedded values are those of the real boot's log in testdata,
	// as gatehouse image measure-platform wrote them.
	log, err := os.ReadFile("testdata/qemu-ovmf-eventlog.bin")
	if err != nil {
		t.Fatal(err)
	}
	measured, err := PlatformFromEventLog(log, "qemu-ovmf", "x", "x", []uint32{0, 2, 3, 7})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.pcrIndices(), measured.pcrIndices(); !slices.Equal(got, want) {
		t.Errorf("qemu-ovmf lists PCRs %v, the real boot's log %v", got, want)
	}
	for _, index := range measured.pcrIndices() {
		if !bytes.Equal(p.pcrs[index].Expected, measured.pcrs[index].Expected) {
			t.Errorf("qemu-ovmf PCR %d %x, the real boot's log replays to %x", index, p.pcrs[index].Expected, measured.pcrs[index].Expected)
		}
	}
	if _, err := embeddedPlatform("aws-nitro"); err == nil || !strings.Contains(err.Error(), "known platforms: qemu-ovmf") {
		t.Errorf("unknown platform: %v", err)
	}
}

func TestParsePlatformRefuses(t *testing.T) {
	zero := strings.Repeat("00", 32)
	tests := []struct {
		name, profile, wantMsg string
	}{
		{"an unknown field", "name: x\nfirmware: y\n", `unknown field "firmware"`},
		{"a bad name", "name: QEMU OVMF\n", "platform name"},
		{"PCR 4 among the platform's", "name: x\npcrs: {4: {expected: \"" + zero + "\"}}\n", "PCR 4 is the UKI's"},
		{"PCR 11 among the platform's", "name: x\npcrs: {11: {expected: \"" + zero + "\"}}\n", "fixes only the firmware's PCRs"},
		{"events that do not replay to the value", "name: x\npcrs: {0: {expected: \"" + zero + "\", events: [{type: EV_POST_CODE, description: x, digest: \"" + zero + "\"}]}}\n", "replay to"},
		{"a short digest", "name: x\npcr4: {before: [{type: EV_SEPARATOR, digest: \"00\"}]}\n", "pcr4.before[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parsePlatform([]byte(tt.profile)); err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %v, want one saying %q", err, tt.wantMsg)
			}
		})
	}
}

// eventLogs are real firmware event logs (go-eventlog's test data) of
// OVMF-based Compute Engine VMs, with and without Secure Boot.
var eventLogs = map[string][]byte{
	"ubuntu 21.04 without secure boot": testdata.Ubuntu2104NoSecureBootEventLog,
	"ubuntu 21.04 without dbx":         testdata.Ubuntu2104NoDbxEventLog,
	"cos 101 on amd sev":               testdata.Cos101AmdSevEventLog,
}

func TestPlatformFromEventLog(t *testing.T) {
	for name, log := range eventLogs {
		t.Run(name, func(t *testing.T) {
			p, err := PlatformFromEventLog(log, "gce-test", "a test VM", "go-eventlog test data", DefaultPlatformPCRs)
			if err != nil {
				t.Fatal(err)
			}
			// go-eventlog replays the log against the profile's values: the
			// profile's expected values are what the firmware's log yields.
			var mrs []register.MR
			for _, index := range DefaultPlatformPCRs {
				mrs = append(mrs, register.PCR{Index: int(index), Digest: p.pcrs[index].Expected, DigestAlg: register.HashSHA256.CryptoHash()})
			}
			el, err := tcg.ParseEventLog(log, tcg.ParseOpts{AllowPadding: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := el.Verify(mrs); err != nil {
				t.Errorf("go-eventlog does not replay the log to the profile's values: %v", err)
			}
			if len(p.pcr4Before) == 0 || p.pcr4Before[0].Type != "EV_EFI_ACTION" || p.pcr4Before[0].Description != "Calling EFI Application from Boot Option" {
				t.Errorf("PCR 4's firmware events %+v: want the boot-option action first", p.pcr4Before)
			}
			for _, e := range p.pcrs[7].Events {
				if e.Description == "" || !strings.Contains(e.Source, "event log sha256:") {
					t.Errorf("PCR 7 event %+v lacks a description or its source", e)
				}
			}
			file, err := p.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			again, err := parsePlatform(file)
			if err != nil {
				t.Fatalf("the written profile does not parse: %v\n%s", err, file)
			}
			for _, index := range DefaultPlatformPCRs {
				if !bytes.Equal(again.pcrs[index].Expected, p.pcrs[index].Expected) || len(again.pcrs[index].Events) != len(p.pcrs[index].Events) {
					t.Errorf("PCR %d changed in the written profile", index)
				}
			}
		})
	}
}

func TestPlatformFromEventLogRefuses(t *testing.T) {
	log := testdata.Ubuntu2104NoSecureBootEventLog
	tests := []struct {
		name    string
		log     []byte
		pcrs    []uint32
		wantMsg string
	}{
		{"PCR 4", log, []uint32{0, 4}, "PCR 4: a platform profile fixes only"},
		{"PCR 9", log, []uint32{9}, "PCR 9: a platform profile fixes only"},
		{"not an event log", []byte("garbage"), DefaultPlatformPCRs, "parsing the event log"},
		{"a truncated log", log[:len(log)/3], DefaultPlatformPCRs, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := PlatformFromEventLog(tt.log, "gce-test", "", "", tt.pcrs); err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %v, want one saying %q", err, tt.wantMsg)
			}
		})
	}
}

func TestReferenceValuesOfABuild(t *testing.T) {
	kernel := predicttest.Kernel(t)
	dir := t.TempDir()
	initrd := bytes.Repeat([]byte("the same initrd "), 500)
	ukis := map[policy.Role]string{}
	for role, cmdline := range map[policy.Role]string{policy.RoleControlPlane: "gatehouse.role=controlPlane", policy.RoleWorker: "gatehouse.role=worker"} {
		ukis[role], _ = predicttest.BuildUKI(t, dir, "uki-"+strings.ToLower(string(role))+".efi", []predicttest.Section{
			{Name: ".cmdline", Content: []byte(cmdline)}, {Name: ".linux", Content: kernel}, {Name: ".initrd", Content: initrd},
		})
	}
	measured, err := PlatformFromEventLog(testdata.Ubuntu2104NoSecureBootEventLog, "qemu-ovmf", "test", "go-eventlog test data", DefaultPlatformPCRs)
	if err != nil {
		t.Fatal(err)
	}
	profile, err := measured.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	profileFile := filepath.Join(dir, "qemu-ovmf.yaml")
	if err := os.WriteFile(profileFile, profile, 0o644); err != nil {
		t.Fatal(err)
	}
	privPEM, pubPEM, err := signedvalues.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	image := signedvalues.Image{Name: "gatehouse-node", Version: "test", ManifestSHA256: strings.Repeat("01", 32), RootHash: strings.Repeat("02", 32)}

	t.Run("embedded profile, unsigned", func(t *testing.T) {
		out, err := ReferenceValues(t.Context(), Build{Platform: "qemu-ovmf", Image: image, UKIs: ukis}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if out.Signed != nil {
			t.Error("signed without a key")
		}
		v, err := signedvalues.ParsePayload(out.Payload)
		if err != nil {
			t.Fatal(err)
		}
		common, roles := v.Split()
		if got := common.Indices(); !slices.Equal(got, []uint32{0, 2, 3, 7, 12, 13}) {
			t.Errorf("common PCRs %v, want 0, 2, 3, 7 (the platform's measured PCRs) and 12, 13 (the untouched PCRs)", got)
		}
		for role, m := range roles {
			if got := m.Indices(); !slices.Equal(got, []uint32{4, 9, 11}) {
				t.Errorf("%s PCRs %v, want 4, 9 and 11 (the UKI, the command line as the kernel's load options, the command line)", role, got)
			}
		}
		if !strings.Contains(strings.Join(v.Notes, "\n"), "PCR 1 is NOT predicted") {
			t.Errorf("notes %q do not say the firmware PCRs are missing", v.Notes)
		}
	})
	t.Run("measured profile, signed", func(t *testing.T) {
		out, err := ReferenceValues(t.Context(), Build{Platform: "qemu-ovmf", PlatformFile: profileFile, Image: image, UKIs: ukis}, privPEM)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := signedvalues.ParsePublicKey(pubPEM)
		if err != nil {
			t.Fatal(err)
		}
		v, err := signedvalues.Verify(t.Context(), out.Signed, pub)
		if err != nil {
			t.Fatal(err)
		}
		common, _ := v.Split()
		for _, index := range DefaultPlatformPCRs {
			if !bytes.Equal(common[index].Expected, measured.pcrs[index].Expected) {
				t.Errorf("PCR %d is not the measured profile's", index)
			}
		}
		if strings.Contains(strings.Join(v.Notes, "\n"), "NOT predicted") {
			t.Errorf("notes %q say PCRs are missing from a measured profile", v.Notes)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for _, tt := range []struct {
			name    string
			build   Build
			key     []byte
			wantMsg string
		}{
			{"an unknown platform", Build{Platform: "qemu-seabios", Image: image, UKIs: ukis}, nil, `platform "qemu-seabios" is unknown`},
			{"a profile of another platform", Build{Platform: "gce", PlatformFile: profileFile, Image: image, UKIs: ukis}, nil, `is for platform "qemu-ovmf", not "gce"`},
			{"no UKI", Build{Platform: "qemu-ovmf", Image: image}, nil, "no UKI given"},
			{"a missing UKI", Build{Platform: "qemu-ovmf", Image: image, UKIs: map[policy.Role]string{policy.RoleWorker: filepath.Join(dir, "none.efi")}}, nil, "worker UKI"},
			{"a bad image", Build{Platform: "qemu-ovmf", Image: signedvalues.Image{Name: "x"}, UKIs: ukis}, nil, "image"},
			{"the public key to sign", Build{Platform: "qemu-ovmf", Image: image, UKIs: ukis}, pubPEM, "signing key"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				_, err := ReferenceValues(context.Background(), tt.build, tt.key)
				if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("error %v, want one saying %q", err, tt.wantMsg)
				}
			})
		}
	})
}

func TestRealOVMFEventLog(t *testing.T) {
	// The firmware's event log of a test UKI booted under QEMU 7.2 q35 with
	// Debian's OVMF 2022.11 and swtpm (Debian kernel 6.1.176), 2026-11-28.
	log, err := os.ReadFile("testdata/qemu-ovmf-eventlog.bin")
	if err != nil {
		t.Fatal(err)
	}
	measured, err := PlatformFromEventLog(log, "qemu-ovmf", "test", "a real boot", DefaultPlatformPCRs)
	if err != nil {
		t.Fatal(err)
	}
	embedded := qemuOVMF(t)
	if measured.secureBoot != embedded.secureBoot {
		t.Errorf("the real boot's Secure Boot is %t, the profile says %t", measured.secureBoot, embedded.secureBoot)
	}
	if len(measured.pcr4Before) != len(embedded.pcr4Before) {
		t.Fatalf("the real boot has PCR 4 events %+v before the UKI, the profile %+v", measured.pcr4Before, embedded.pcr4Before)
	}
	for i, e := range measured.pcr4Before {
		if e.Type != embedded.pcr4Before[i].Type || !bytes.Equal(e.Digest, embedded.pcr4Before[i].Digest) {
			t.Errorf("PCR 4 event %d: the real boot's %s %x, the profile's %s %x", i, e.Type, e.Digest, embedded.pcr4Before[i].Type, embedded.pcr4Before[i].Digest)
		}
	}
	// What the boot chain table says happens after the UKI starts must be
	// what the real boot logged: the kernel's image in PCR 4, the kernel's
	// tagged events in PCR 9.
	chain, err := loadBootChain()
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, e := range chain.Events {
		if e.Measured && e.appliesTo(embedded.secureBoot) && e.PCR != 11 {
			want = append(want, fmt.Sprintf("%d %s %s", e.PCR, e.Type, e.Description))
		}
	}
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		t.Fatal(err)
	}
	applications := 0
	for _, e := range el.Events(register.HashSHA256) {
		switch {
		case e.Index == 4 && e.Type == tcg.EFIBootServicesApplication:
			if applications++; applications > 1 { // the first is the UKI itself
				got = append(got, "4 EV_EFI_BOOT_SERVICES_APPLICATION .linux, the kernel systemd-stub loads with LoadImage")
			}
		case e.Index == 9 && e.Type == tcg.EventTag:
			tagged, err := tcg.ParseTaggedEventData(e.Data)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, "9 EV_EVENT_TAG "+strings.TrimRight(string(tagged.Data), "\x00"))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("the real boot's events after the UKI:\n%s\nbootchain.yaml expects:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSecureBootFromEventLog(t *testing.T) {
	states := map[bool]int{}
	for name, log := range eventLogs {
		p, err := PlatformFromEventLog(log, "gce-test", "", "", DefaultPlatformPCRs)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		states[p.secureBoot]++
	}
	if states[true] == 0 || states[false] == 0 {
		t.Errorf("Secure Boot states read from the logs: %v; the test logs have both", states)
	}
}
