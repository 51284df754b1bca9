package tpm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-eventlog/testdata"
)

func utf16le(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = binary.LittleEndian.AppendUint16(b, u)
	}
	return b
}

// variable is a UEFI_VARIABLE_DATA (Firmware Profile §10.4.3) of name.
func variable(name string, data []byte) []byte {
	b := make([]byte, 16) // the variable's GUID
	b = binary.LittleEndian.AppendUint64(b, uint64(len([]rune(name))))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(data)))
	b = append(b, utf16le(name)...)
	return append(b, data...)
}

func TestDescribeEvent(t *testing.T) {
	long := strings.Repeat("a", 200)
	tests := []struct {
		name string
		typ  tcg.EventType
		data []byte
		want string
	}{
		{"systemd-stub's UKI section, UTF-16", tcg.Ipl, utf16le(".cmdline\x00"), ".cmdline"},
		{"GRUB's command, ASCII", tcg.Ipl, []byte("grub_cmd: linux /vmlinuz\x00"), "grub_cmd: linux /vmlinuz"},
		{"an EFI action", tcg.EFIAction, []byte(tcg.ExitBootServicesInvocation), tcg.ExitBootServicesInvocation},
		{"a Secure Boot variable", tcg.EFIVariableDriverConfig, variable("SecureBoot", []byte{1}), "SecureBoot"},
		{"a boot variable", tcg.EFIVariableBoot, variable("Boot0001", make([]byte, 64)), "Boot0001"},
		{"a variable whose name overruns its data", tcg.EFIVariableBoot, variable("Boot0001", nil)[:40], ""},
		{"a firmware blob's description", tcg.EFIPlatformFirmwareBlob2, append([]byte{5}, "DXEFV\x00\x00\x00\x00"...), "DXEFV"},
		{"a tagged event (Linux's EFI stub measuring the initrd)", tcg.EventTag, append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 0x8F3B22ED), 13), "Linux initrd\x00"...), "Linux initrd"},
		{"a tagged event longer than its data", tcg.EventTag, binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 0x8F3B22ED), 13), ""},
		{"a separator", tcg.Separator, make([]byte, 4), ""},
		{"binary data", tcg.PostCode, []byte{0x01, 0x02, 0xff, 0x80, 0x00, 0x13}, ""},
		{"control characters are replaced", tcg.Ipl, []byte("line one\nline two and more text"), "line one\uFFFDline two and more text"},
		{"long strings are cut", tcg.Ipl, []byte(long), strings.Repeat("a", maxDescription) + "…"},
		{"long UTF-16 strings are cut", tcg.Ipl, utf16le(long), strings.Repeat("a", maxDescription) + "…"},
		{"an unknown type holding text", tcg.EventType(0x1234), []byte("vendor"), "vendor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describeEvent(tt.typ, tt.data); got != tt.want {
				t.Fatalf("describeEvent = %q, want %q", got, tt.want)
			}
		})
	}
}

// archPCRs are the SHA-256 PCR values go-eventlog recorded with its real
// event log of an Arch Linux workstation (systemd-boot, Secure Boot off;
// testdata.ArchLinuxWorkstationEventLog, values from its
// tpmeventlog/replay_test.go).
func archPCRs(t *testing.T) map[uint32][]byte {
	t.Helper()
	pcrs := map[uint32][]byte{}
	for index, value := range []string{
		"758b773d94feabf52ef5a4c00a7ad2c80d8d6e6d9d58756150be9bc973da9087",
		"bfda688a5d320123fddb3fc70b746bc17647e2e7f2f96e130d429542bf4622d5",
		"65dee4a48cde677aa89fa83c5c35e883fda658f743853e3ebad504ca6702f7c5",
		"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
		"925d453d3dfef4ac0c72c957402163d45fa95d05e6d53f047263a3a60b598325",
		"202522f005ef625588bb7c9e21335ba96a63c5086306138885b3bb2c381730ca",
		"3d458cfe55cc03ea1f443f1562beec8df51c75e14a9fcf9a7234a13f198e7969",
		"3b4a4db44b7a872524055364e62e897ae678e0d47ab0809f65c3a4ed77f66ab9",
		"47591b43af431963eaeb5238a5c42eda1eb0014c27f7de7ae483066a2d2a2e61",
	} {
		v, err := hex.DecodeString(value)
		if err != nil {
			t.Fatal(err)
		}
		pcrs[uint32(index)] = v
	}
	return pcrs
}

func TestReplayCacheServesOnlyEqualLogsAndValues(t *testing.T) {
	log := testdata.ArchLinuxWorkstationEventLog
	good := archPCRs(t)
	order := []int{0, 1, 2, 3, 4, 5, 6, 7, 8}
	c := newReplayCache()
	first, err := c.replay(log, good, order)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.replay(log, good, order)
	if err != nil || len(again) != len(first) || &again[0] != &first[0] {
		t.Fatalf("the same log and values again: %v, want the remembered events", err)
	}
	other := map[uint32][]byte{}
	for k, v := range good {
		other[k] = v
	}
	other[4] = bytes.Repeat([]byte{4}, 32)
	if _, err := c.replay(log, other, order); err == nil {
		t.Fatal("the same log with another PCR 4 value replayed: served from memory")
	}
	edited := bytes.Clone(log)
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{})
	if err != nil {
		t.Fatal(err)
	}
	digest := el.Events(register.HashSHA256)[5].Digest
	edited[bytes.Index(edited, digest)] ^= 1
	if _, err := c.replay(edited, good, order); err == nil {
		t.Fatal("an edited log replayed: served from memory")
	}
	// Past its size the cache forgets the logs used least recently.
	full := newReplayCache()
	for i := 0; full.size < replayCacheBytes-1024; i++ {
		old := &replayEntry{hash: uint64(i), log: make([]byte, 1<<16)}
		full.byHash[old.hash] = full.recency.PushFront(old)
		full.size += len(old.log)
	}
	if _, err := full.replay(log, good, order); err != nil {
		t.Fatal(err)
	}
	if _, oldest := full.byHash[0]; oldest || full.size > replayCacheBytes {
		t.Fatalf("cache holds %d bytes of logs (at most %d allowed), the oldest still: %t", full.size, replayCacheBytes, oldest)
	}
	if again, _ := full.replay(log, good, order); len(again) == 0 || full.recency.Front().Value.(*replayEntry).hash == 0 {
		t.Fatal("the log just replayed is not remembered")
	}
}
