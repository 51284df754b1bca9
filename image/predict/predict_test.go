package predict

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/image/predict/predicttest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

func sum(data []byte) []byte {
	s := sha256.Sum256(data)
	return s[:]
}

// systemdMeasure returns systemd-measure's PCR 11 value for the section
// files, right after systemd-stub (the empty phase).
func systemdMeasure(t *testing.T, files map[string]string) []byte {
	t.Helper()
	tool := predicttest.RequireTool(t, predicttest.SystemdMeasure, "systemd")
	args := []string{"calculate", "--bank=sha256", "--phase=", "--json=short"}
	for name, path := range files {
		args = append(args, "--"+strings.TrimPrefix(name, ".")+"="+path)
	}
	out, err := exec.CommandContext(t.Context(), tool, args...).Output()
	if err != nil {
		t.Fatalf("systemd-measure %v: %v", args, err)
	}
	var result struct {
		SHA256 []struct {
			PCR  int    `json:"pcr"`
			Hash string `json:"hash"`
		} `json:"sha256"`
	}
	if err := json.Unmarshal(out, &result); err != nil || len(result.SHA256) != 1 || result.SHA256[0].PCR != 11 {
		t.Fatalf("systemd-measure printed %s (%v)", out, err)
	}
	value, err := hex.DecodeString(result.SHA256[0].Hash)
	if err != nil {
		t.Fatal(err)
	}
	return value
}

func qemuOVMF(t *testing.T) Platform {
	t.Helper()
	p, err := embeddedPlatform("qemu-ovmf")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPCR11MatchesSystemdMeasure(t *testing.T) {
	kernel := predicttest.Kernel(t)
	tests := []struct {
		name     string
		sections []predicttest.Section
	}{
		{"kernel only", []predicttest.Section{{Name: ".linux", Content: kernel}}},
		{"kernel, os-release, command line, initrd", []predicttest.Section{
			{Name: ".osrel", Content: []byte("ID=debian\nVERSION_ID=12\n")},
			{Name: ".cmdline", Content: []byte("console=ttyS0 gatehouse.role=worker roothash=" + strings.Repeat("ab", 32))},
			{Name: ".linux", Content: kernel},
			{Name: ".initrd", Content: bytes.Repeat([]byte{0x30, 0x37, 0x30, 0x37}, 1234)},
		}},
		{"every measured section, added out of order", []predicttest.Section{
			{Name: ".initrd", Content: []byte("initrd")},
			{Name: ".dtb", Content: []byte("device tree")},
			{Name: ".splash", Content: []byte("BM splash")},
			{Name: ".linux", Content: kernel},
			{Name: ".cmdline", Content: []byte("quiet\n")},
			{Name: ".osrel", Content: []byte("ID=debian\n")},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, files := predicttest.BuildUKI(t, t.TempDir(), "uki.efi", tt.sections)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			u, err := parseUKI("uki.efi", data)
			if err != nil {
				t.Fatal(err)
			}
			events := u.pcr11Events()
			want := systemdMeasure(t, files)
			if got := replay(events); !bytes.Equal(got, want) {
				t.Errorf("PCR 11 %x, systemd-measure says %x", got, want)
			}
			if n := len(events); n != 2*len(tt.sections) {
				t.Errorf("PCR 11 has %d events, want a name and a content event per section (%d)", n, 2*len(tt.sections))
			}
			for i, e := range events {
				if e.Type != "EV_IPL" || !strings.HasPrefix(e.Description, ".") || e.Source == "" {
					t.Errorf("PCR 11 event %d: %+v", i, e)
				}
			}
		})
	}
}

// osslsigncodeDigest returns the Authenticode SHA-256 osslsigncode computes
// for a PE file: the digest of the SpcIndirectDataContent it would sign.
func osslsigncodeDigest(t *testing.T, path string) []byte {
	t.Helper()
	tool := predicttest.RequireTool(t, "osslsigncode", "osslsigncode")
	out := filepath.Join(t.TempDir(), "data.p7")
	if output, err := exec.CommandContext(t.Context(), tool, "extract-data", "-h", "sha256", "-in", path, "-out", out).CombinedOutput(); err != nil {
		t.Fatalf("osslsigncode extract-data: %v\n%s", err, output)
	}
	der, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// DigestInfo: AlgorithmIdentifier{sha256, NULL}, OCTET STRING (32 bytes).
	prefix, _ := hex.DecodeString("0609608648016503040201050004" + "20")
	i := bytes.Index(der, prefix)
	if i < 0 || i+len(prefix)+32 > len(der) {
		t.Fatalf("no SHA-256 DigestInfo in osslsigncode's output %x", der)
	}
	return der[i+len(prefix) : i+len(prefix)+32]
}

func TestAuthenticodeMatchesOsslsigncode(t *testing.T) {
	kernel := predicttest.Kernel(t)
	dir := t.TempDir()
	path, _ := predicttest.BuildUKI(t, dir, "uki.efi", []predicttest.Section{
		{Name: ".cmdline", Content: []byte("console=ttyS0")}, {Name: ".linux", Content: kernel}, {Name: ".initrd", Content: []byte("initrd")},
	})
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data)%8 == 0 {
		t.Fatalf("the test UKI has %d bytes; the test needs one whose size is not a multiple of 8", len(data))
	}
	padded := append(bytes.Clone(data), make([]byte, 8-len(data)%8)...)
	paddedPath := filepath.Join(dir, "padded.efi")
	if err := os.WriteFile(paddedPath, padded, 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("a file of 8-byte multiple size", func(t *testing.T) {
		got, err := authenticode(padded)
		if err != nil {
			t.Fatal(err)
		}
		if want := osslsigncodeDigest(t, paddedPath); !bytes.Equal(got, want) {
			t.Errorf("Authenticode %x, osslsigncode says %x", got, want)
		}
	})
	t.Run("an unaligned file is hashed as it lies, as the firmware does; osslsigncode pads it", func(t *testing.T) {
		got, err := authenticode(data)
		if err != nil {
			t.Fatal(err)
		}
		if want := osslsigncodeDigest(t, path); bytes.Equal(got, want) {
			t.Error("the unaligned file hashed like its padded form: the firmware hashes the file as it is (EDK2 Tcg2MeasurePeImage)")
		}
		if want, _ := authenticode(padded); !bytes.Equal(osslsigncodeDigest(t, path), want) {
			t.Error("osslsigncode's digest of the unaligned file is not that of the file padded to 8 bytes")
		}
	})
	t.Run("a signature appended by osslsigncode leaves the hash unchanged", func(t *testing.T) {
		openssl := predicttest.RequireTool(t, "openssl", "openssl")
		osslsigncode := predicttest.RequireTool(t, "osslsigncode", "osslsigncode")
		key, cert, signed := filepath.Join(dir, "key.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "signed.efi")
		for _, cmd := range [][]string{
			{openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert, "-subj", "/CN=test", "-days", "1"},
			{osslsigncode, "sign", "-h", "sha256", "-certs", cert, "-key", key, "-in", paddedPath, "-out", signed},
		} {
			if out, err := exec.CommandContext(t.Context(), cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", filepath.Base(cmd[0]), err, out)
			}
		}
		signedData, err := os.ReadFile(signed)
		if err != nil {
			t.Fatal(err)
		}
		got, err := authenticode(signedData)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := authenticode(padded); !bytes.Equal(got, want) {
			t.Errorf("signed file hashes to %x, the unsigned one to %x", got, want)
		}
	})
}

func TestPredictPCR4AndPCR9(t *testing.T) {
	kernel := predicttest.Kernel(t)
	initrd := bytes.Repeat([]byte("initrd "), 1000)
	path, _ := predicttest.BuildUKI(t, t.TempDir(), "uki-worker.efi", []predicttest.Section{
		{Name: ".cmdline", Content: []byte("gatehouse.role=worker")}, {Name: ".linux", Content: kernel}, {Name: ".initrd", Content: initrd},
	})
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := predict("uki-worker.efi", data, qemuOVMF(t))
	if err != nil {
		t.Fatal(err)
	}
	digest, err := authenticode(data)
	if err != nil {
		t.Fatal(err)
	}
	kernelDigest, err := authenticode(kernel)
	if err != nil {
		t.Fatal(err)
	}
	action, separator := sum([]byte("Calling EFI Application from Boot Option")), sum([]byte{0, 0, 0, 0})
	wantPCR4 := replay([]measurements.Event{{Type: "EV_EFI_ACTION", Digest: action}, {Type: "EV_SEPARATOR", Digest: separator},
		{Type: "EV_EFI_BOOT_SERVICES_APPLICATION", Digest: digest}, {Type: "EV_EFI_BOOT_SERVICES_APPLICATION", Digest: kernelDigest}})
	if got := p.Values[4]; !bytes.Equal(got.Expected, wantPCR4) || len(got.Events) != 4 || got.Events[2].Type != "EV_EFI_BOOT_SERVICES_APPLICATION" ||
		!strings.Contains(got.Events[2].Source, "uki-worker.efi Authenticode") || !strings.Contains(got.Events[1].Source, "platform qemu-ovmf: EV_SEPARATOR") ||
		!strings.Contains(got.Events[3].Source, "section .linux Authenticode") {
		t.Errorf("PCR 4 %x %+v, want %x from the action, the separator, the UKI and the kernel", got.Expected, got.Events, wantPCR4)
	}
	options := make([]byte, 0, 2*22)
	for _, c := range "gatehouse.role=worker\x00" {
		options = append(options, byte(c), 0)
	}
	wantPCR9 := replay([]measurements.Event{{Type: "EV_EVENT_TAG", Digest: sum(options)}, {Type: "EV_EVENT_TAG", Digest: sum(initrd)}})
	if got := p.Values[9]; !bytes.Equal(got.Expected, wantPCR9) || len(got.Events) != 2 || got.Events[0].Description != "LOADED_IMAGE::LoadOptions" ||
		got.Events[1].Description != "Linux initrd" || !strings.Contains(got.Events[1].Source, "section .initrd (sha256 of 7000 bytes)") {
		t.Errorf("PCR 9 %x %+v, want %x: the command line as load options, then the initrd", got.Expected, got.Events, wantPCR9)
	}
	for _, index := range []uint32{12, 13} {
		if got := p.Values[index]; !bytes.Equal(got.Expected, make([]byte, 32)) || len(got.Events) != 0 {
			t.Errorf("PCR %d %x, want zero", index, got.Expected)
		}
	}
	for _, index := range []uint32{0, 2, 3, 7} {
		if got := p.Values[index]; len(got.Expected) != 32 || len(got.Events) == 0 || !strings.Contains(got.Events[0].Source, "event log sha256:") {
			t.Errorf("PCR %d %+v, want platform qemu-ovmf's measured value with its events", index, got)
		}
	}
	if _, ok := p.Values[1]; ok {
		t.Error("PCR 1 predicted, but platform qemu-ovmf leaves it out (its boot variables depend on the VM's devices)")
	}
	if notes := strings.Join(p.Notes, "\n"); !strings.Contains(notes, "PCR 1 is NOT predicted") || !strings.Contains(notes, "systemd-stub 252") {
		t.Errorf("notes do not say that the firmware PCRs are not predicted:\n%s", notes)
	}
}

func TestPredictWithoutInitrd(t *testing.T) {
	kernel := predicttest.Kernel(t)
	path, _ := predicttest.BuildUKI(t, t.TempDir(), "uki.efi", []predicttest.Section{{Name: ".cmdline", Content: []byte("quiet")}, {Name: ".linux", Content: kernel}})
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := predict("uki.efi", data, qemuOVMF(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Values[9]; len(got.Events) != 1 || got.Events[0].Description != "LOADED_IMAGE::LoadOptions" {
		t.Errorf("PCR 9 %x %+v: without an initrd the kernel measures only its load options", got.Expected, got.Events)
	}
}

// setSectionField overwrites a 32-bit field of the section header of the
// named section (offset within the 40-byte header).
func setSectionField(t *testing.T, data []byte, name string, offset int, value uint32) []byte {
	t.Helper()
	data = bytes.Clone(data)
	peOffset := int(binary.LittleEndian.Uint32(data[0x3c:]))
	optSize := int(binary.LittleEndian.Uint16(data[peOffset+4+16:]))
	count := int(binary.LittleEndian.Uint16(data[peOffset+4+2:]))
	table := peOffset + 4 + 20 + optSize
	for i := range count {
		h := data[table+40*i : table+40*i+40]
		if string(bytes.TrimRight(h[:8], "\x00")) == name {
			binary.LittleEndian.PutUint32(h[offset:], value)
			return data
		}
	}
	t.Fatalf("no section %s", name)
	return nil
}

func TestPredictRefuses(t *testing.T) {
	kernel := predicttest.Kernel(t)
	dir := t.TempDir()
	uki := func(name string, sections ...predicttest.Section) []byte {
		path, _ := predicttest.BuildUKI(t, dir, name, sections)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	linux := predicttest.Section{Name: ".linux", Content: kernel}
	noCmdline := uki("no-cmdline.efi", linux, predicttest.Section{Name: ".initrd", Content: []byte("initrd")})
	cmdline := predicttest.Section{Name: ".cmdline", Content: []byte("quiet")}
	otherStub := filepath.Join(dir, "magic")
	if err := os.WriteFile(otherStub, []byte("#### LoaderInfo: systemd-stub 257.1 ####\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	newerStub := filepath.Join(dir, "newer.efi")
	if out, err := exec.CommandContext(t.Context(), predicttest.RequireTool(t, "objcopy", "binutils"), "--update-section", ".sdmagic="+otherStub,
		filepath.Join(dir, "no-cmdline.efi"), newerStub).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, out)
	}
	newer, err := os.ReadFile(newerStub)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		data    []byte
		wantMsg string
	}{
		{"not a PE file", []byte("MZ but nothing else"), "is not a PE file"},
		{"the stub alone", mustRead(t, predicttest.Stub), "has no .linux section"},
		{"a section systemd-stub takes for .linux", uki("prefix.efi", cmdline, linux, predicttest.Section{Name: ".linux2", Content: []byte("x")}), "sections systemd-stub takes for .linux"},
		{"a .pcrpkey section", uki("pcrpkey.efi", cmdline, linux, predicttest.Section{Name: ".initrd", Content: []byte("i")}, predicttest.Section{Name: ".pcrpkey", Content: []byte("k")}), "appends to the initrd"},
		{"a stub other than 252", newer, `not systemd-stub 252`},
		{"no .cmdline section", noCmdline, "has no .cmdline section"},
		{"a gap before a section", setSectionField(t, noCmdline, ".sbat", 20, binary.LittleEndian.Uint32(sectionHeader(t, noCmdline, ".sbat")[20:])+0x200), "not well defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := predict("uki.efi", tt.data, qemuOVMF(t))
			if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %v, want one saying %q", err, tt.wantMsg)
			}
		})
	}
}

// sectionHeader returns the 40-byte header of the named section.
func sectionHeader(t *testing.T, data []byte, name string) []byte {
	t.Helper()
	peOffset := int(binary.LittleEndian.Uint32(data[0x3c:]))
	optSize := int(binary.LittleEndian.Uint16(data[peOffset+4+16:]))
	count := int(binary.LittleEndian.Uint16(data[peOffset+4+2:]))
	table := peOffset + 4 + 20 + optSize
	for i := range count {
		h := data[table+40*i : table+40*i+40]
		if string(bytes.TrimRight(h[:8], "\x00")) == name {
			return h
		}
	}
	t.Fatalf("no section %s", name)
	return nil
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	predicttest.RequireTool(t, path, "systemd-boot-efi")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestLoadOptions(t *testing.T) {
	tests := []struct {
		cmdline, want string
	}{
		{"console=ttyS0", "console=ttyS0"},
		{"a\nb\t c  \n", "a b  c"},
		{"root=x\x00ignored", "root=x"},
		{"é", "é"},
	}
	for _, tt := range tests {
		got, err := loadOptions([]byte(tt.cmdline))
		if err != nil {
			t.Fatal(err)
		}
		var want []byte
		for _, r := range tt.want {
			want = binary.LittleEndian.AppendUint16(want, uint16(r))
		}
		want = append(want, 0, 0)
		if !bytes.Equal(got, want) {
			t.Errorf("loadOptions(%q) = %x, want %x", tt.cmdline, got, want)
		}
	}
	if _, err := loadOptions([]byte{0xff, 0xfe}); err == nil {
		t.Error("invalid UTF-8 accepted")
	}
}

func TestBootChainTable(t *testing.T) {
	c, err := loadBootChain()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range c.Events {
		if e.Why == "" || e.Type == "" {
			t.Errorf("event %+v: every entry says what and why", e)
		}
	}
	// The table's one measured PCR 4 candidate, the kernel's Authenticode,
	// must be computable from a real PE in .linux.
	stub := mustRead(t, predicttest.Stub)
	digest, _, err := chainEvent{DigestOf: "linux-authenticode"}.digest(&uki{name: "uki.efi", sections: map[string][]byte{".linux": stub}})
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := authenticode(stub); !bytes.Equal(digest, want) {
		t.Errorf("kernel Authenticode %x, want %x", digest, want)
	}
}
