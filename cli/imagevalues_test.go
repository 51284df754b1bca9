package cli

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-eventlog/testdata"

	"github.com/gatehouse-dev/gatehouse/image/predict/predicttest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
)

// signedBuild is what an image build leaves for config generate: two
// UKIs' values, unsigned and signed, and the signing key pair.
type signedBuild struct {
	dir, unsigned, signed, privKey, pubKey, akFile string
}

// buildSignedValues builds two UKIs from systemd-stub, predicts and signs
// their values through the CLI as a user would.
func buildSignedValues(t *testing.T) signedBuild {
	t.Helper()
	dir := t.TempDir()
	b := signedBuild{dir: dir, unsigned: filepath.Join(dir, "values.json"), signed: filepath.Join(dir, "values.signed.json"),
		privKey: filepath.Join(dir, "signing.key"), pubKey: filepath.Join(dir, "signing.pub"), akFile: filepath.Join(dir, "ak.pem")}
	kernel := predicttest.Kernel(t)
	initrd := bytes.Repeat([]byte("initrd "), 300)
	ukis := map[string]string{}
	for role, cmdline := range map[string]string{"controlPlane": "gatehouse.role=controlPlane", "worker": "gatehouse.role=worker"} {
		ukis[role], _ = predicttest.BuildUKI(t, dir, "uki-"+strings.ToLower(role)+".efi", []predicttest.Section{
			{Name: ".cmdline", Content: []byte(cmdline)}, {Name: ".linux", Content: kernel}, {Name: ".initrd", Content: initrd},
		})
	}
	manifest := filepath.Join(dir, "manifest.json")
	if err := os.WriteFile(manifest, []byte(`{"components":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run(t, "image", "keygen", "--private-key", b.privKey, "--public-key", b.pubKey)
	if !strings.Contains(out, "key id ") {
		t.Errorf("keygen printed no key id: %s", out)
	}
	if info, err := os.Stat(b.privKey); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("private key mode %v (%v), want 0600", info.Mode(), err)
	}
	out = run(t, "image", "predict", "--control-plane-uki", ukis["controlPlane"], "--worker-uki", ukis["worker"], "--image-version", "v0.1.0",
		"--manifest", manifest, "--root-hash", strings.Repeat("5a", 32), "--output", b.unsigned)
	for _, want := range []string{"PCR 11 = ", "EV_IPL \".cmdline\"", "EV_EFI_BOOT_SERVICES_APPLICATION \"uki-worker.efi\"", "PCR 1 is NOT predicted"} {
		if !strings.Contains(out, want) {
			t.Errorf("predict's output lacks %q:\n%s", want, out)
		}
	}
	run(t, "image", "sign-values", "--key", b.privKey, "--in", b.unsigned, "--out", b.signed)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.akFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConfigGenerateFromSignedValues(t *testing.T) {
	b := buildSignedValues(t)
	config := filepath.Join(b.dir, "gatehouse.yaml")
	out := run(t, "config", "generate", "--output", config, "--reference-values-from", b.signed, "--verify-key", b.pubKey, "--pinned-ak", b.akFile)
	if !strings.Contains(out, "image gatehouse-node v0.1.0") || !strings.Contains(out, "on platform qemu-ovmf, signed by key ") {
		t.Errorf("config generate does not say where the values came from:\n%s", out)
	}
	c, err := clusterconfig.Load(config)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Attestation
	for _, index := range []int{9, 11, 12, 13, 15} {
		if !slices.Contains(p.PCRs, index) {
			t.Errorf("pcrs %v lack %d, which the signed values check (or the node lock)", p.PCRs, index)
		}
	}
	common, err := measurements.Parse(p.ReferenceValues, 32)
	if err != nil {
		t.Fatal(err)
	}
	if got := common.Indices(); !slices.Equal(got, []uint32{0, 2, 3, 7, 12, 13}) {
		t.Errorf("referenceValues PCRs %v, want 0, 2, 3, 7, 12, 13 (what both roles share: the platform's and the untouched PCRs)", got)
	}
	for _, role := range []policy.Role{policy.RoleControlPlane, policy.RoleWorker} {
		m, err := measurements.Parse(p.Roles[role].ReferenceValues, 32)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Indices(); !slices.Equal(got, []uint32{4, 9, 11}) || len(m[11].Events) != 6 {
			t.Errorf("roles.%s PCRs %v with %d PCR 11 events, want 4, 9 and 11 with the stub's 6", role, got, len(m[11].Events))
		}
		if e := m[9].Events; len(e) != 2 || e[1].Description != "Linux initrd" || !strings.Contains(e[1].Source, "section .initrd") {
			t.Errorf("roles.%s PCR 9's events %+v did not reach the policy", role, e)
		}
	}
	if _, err := p.Appraisal(time.Now, nil); err != nil {
		t.Errorf("the generated policy does not compile: %v", err)
	}
}

func TestConfigGenerateRefusesSignedValues(t *testing.T) {
	b := buildSignedValues(t)
	signed, err := os.ReadFile(b.signed)
	if err != nil {
		t.Fatal(err)
	}
	var envelope map[string]any
	if err := json.Unmarshal(signed, &envelope); err != nil {
		t.Fatal(err)
	}
	write := func(name string, edit func(e map[string]any)) string {
		e := map[string]any{}
		for k, v := range envelope {
			e[k] = v
		}
		edit(e)
		data, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(b.dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	altered := write("altered.json", func(e map[string]any) {
		payload, _ := base64.StdEncoding.DecodeString(e["payload"].(string))
		i := bytes.Index(payload, []byte(`"expected":"`)) + len(`"expected":"`)
		if payload[i] == '0' { // one hex digit of a PCR value
			payload[i] = '1'
		} else {
			payload[i] = '0'
		}
		e["payload"] = base64.StdEncoding.EncodeToString(payload)
	})
	swapped := write("swapped.json", func(e map[string]any) { e["payloadType"] = "application/vnd.in-toto+json" })
	// The attacker's own key pair re-signs the values (here unchanged; an
	// attacker would change them first).
	attackerPriv, attackerPub := filepath.Join(b.dir, "attacker.key"), filepath.Join(b.dir, "attacker.pub")
	run(t, "image", "keygen", "--private-key", attackerPriv, "--public-key", attackerPub)
	resigned := filepath.Join(b.dir, "resigned.json")
	run(t, "image", "sign-values", "--key", attackerPriv, "--in", b.unsigned, "--out", resigned)
	// Values signed by the trusted key whose roles do not differ: the
	// control plane's UKI given for both roles.
	var same map[string]any
	unsigned, err := os.ReadFile(b.unsigned)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(unsigned, &same); err != nil {
		t.Fatal(err)
	}
	roles := same["roles"].(map[string]any)
	roles["worker"] = roles["controlPlane"]
	sameFile, sameSigned := filepath.Join(b.dir, "same.json"), filepath.Join(b.dir, "same.signed.json")
	data, err := json.Marshal(same)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sameFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "image", "sign-values", "--key", b.privKey, "--in", sameFile, "--out", sameSigned)
	plain := filepath.Join(b.dir, "plain.yaml")
	if err := os.WriteFile(plain, []byte("4: {expected: \""+strings.Repeat("ab", 32)+"\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		args    []string
		wantMsg string
	}{
		{"an altered byte in the payload", []string{"--reference-values-from", altered, "--verify-key", b.pubKey}, "the signature does not verify"},
		{"values re-signed by another key", []string{"--reference-values-from", resigned, "--verify-key", b.pubKey}, "not signed by the verify key"},
		{"a swapped payload type", []string{"--reference-values-from", swapped, "--verify-key", b.pubKey}, `payloadType "application/vnd.in-toto+json"`},
		{"plain reference values", []string{"--reference-values-from", plain, "--verify-key", b.pubKey}, "values nobody signed go to --reference-values"},
		{"the unsigned payload", []string{"--reference-values-from", b.unsigned, "--verify-key", b.pubKey}, "gatehouse image sign-values"},
		{"a signed file without a verify key", []string{"--reference-values-from", b.signed}, "--reference-values-from and --verify-key go together"},
		{"a verify key without a signed file", []string{"--verify-key", b.pubKey}, "--reference-values-from and --verify-key go together"},
		{"the private key as verify key", []string{"--reference-values-from", b.signed, "--verify-key", b.privKey}, "never pass the private key"},
		{"signed and unsigned values together", []string{"--reference-values-from", b.signed, "--verify-key", b.pubKey, "--reference-values", plain}, "not both"},
		{"roles that measure alike", []string{"--reference-values-from", sameSigned, "--verify-key", b.pubKey}, "equal at every PCR"},
		{"quoted PCRs that miss signed values", []string{"--reference-values-from", b.signed, "--verify-key", b.pubKey, "--pcrs", "0,4,9,11,15"}, "--pcrs lacks PCRs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			config := filepath.Join(t.TempDir(), "gatehouse.yaml")
			args := append([]string{"config", "generate", "--output", config, "--pinned-ak", b.akFile}, tt.args...)
			out, err := runErr(t, args...)
			if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %v, want one saying %q\n%s", err, tt.wantMsg, out)
			}
			if _, err := os.Stat(config); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a configuration was written (%v)", err)
			}
		})
	}
}

func TestImageMeasurePlatform(t *testing.T) {
	dir := t.TempDir()
	log, profile := filepath.Join(dir, "binary_bios_measurements"), filepath.Join(dir, "gce-test.yaml")
	if err := os.WriteFile(log, testdata.Ubuntu2104NoSecureBootEventLog, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runErr(t, "image", "measure-platform", "--event-log", log, "--name", "gce-test", "--output", profile); err == nil || !strings.Contains(err.Error(), "--source is required") {
		t.Errorf("a profile without a source: %v", err)
	}
	run(t, "image", "measure-platform", "--event-log", log, "--name", "gce-test", "--description", "a Compute Engine VM",
		"--source", "go-eventlog's test data", "--output", profile)
	data, err := os.ReadFile(profile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name: gce-test", "source: \"measured: event log sha256:", "Calling EFI Application from Boot Option", "\n  7: {expected: "} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the profile lacks %q:\n%s", want, data)
		}
	}
	if _, err := runErr(t, "image", "measure-platform", "--event-log", log, "--name", "gce-test", "--source", "x", "--pcrs", "4", "--output", filepath.Join(dir, "x.yaml")); err == nil ||
		!strings.Contains(err.Error(), "fixes only the firmware's PCRs") {
		t.Errorf("PCR 4 in a platform profile: %v", err)
	}
}
