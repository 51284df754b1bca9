package joinconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"maps"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

func pinnedAK(t testing.TB) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ")
}

func validData(t testing.TB) map[string]string {
	t.Helper()
	return map[string]string{
		KeyAttestation: `variant: tpm
pcrs: [4, 8, 15]
referenceValues:
  4: {expected: "` + strings.Repeat("ab", 32) + `"}
roles:
  controlPlane:
    referenceValues:
      8: {expected: "` + strings.Repeat("c0", 32) + `"}
  worker:
    referenceValues:
      8: {expected: "` + strings.Repeat("f0", 32) + `"}
pinnedAKs:
  - |
` + indent(pinnedAK(t)) + "\n",
		KeyMeasurementSalt:      strings.Repeat("01", 32),
		KeyAPIServerEndpoint:    "10.0.0.1:6443",
		KeyKubernetesVersion:    "v1.36.4",
		KeyKubernetesComponents: `[{"url": "https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet", "hash": "sha256:` + strings.Repeat("cd", 32) + `", "installPath": "/run/state/bin/kubelet"}]`,
	}
}

func TestParseJoinConfig(t *testing.T) {
	valid := validData(t)
	change := func(key, value string) map[string]string {
		d := maps.Clone(valid)
		d[key] = value
		return d
	}
	policy := func(edit func(string) string) map[string]string {
		return change(KeyAttestation, edit(valid[KeyAttestation]))
	}
	withoutAKs, _, _ := strings.Cut(valid[KeyAttestation], "pinnedAKs")
	tests := []struct {
		name    string
		data    map[string]string
		wantErr string
	}{
		{name: "valid", data: valid},
		{name: "missing key", data: change(KeyKubernetesVersion, ""), wantErr: `key "kubernetesVersion" is missing`},
		{name: "short salt", data: change(KeyMeasurementSalt, "00"), wantErr: "measurementSalt must be 32 bytes as hex"},
		{name: "endpoint without port", data: change(KeyAPIServerEndpoint, "10.0.0.1"), wantErr: "is not host:port"},
		{name: "bad version", data: change(KeyKubernetesVersion, "1.36"), wantErr: "not a release version"},
		{name: "components not JSON", data: change(KeyKubernetesComponents, "kubelet"), wantErr: "not a JSON array"},
		{name: "component over ftp", data: change(KeyKubernetesComponents, strings.Replace(valid[KeyKubernetesComponents], "https", "ftp", 1)), wantErr: "is not https, http, file or data"},
		{name: "component with bad hash", data: change(KeyKubernetesComponents, strings.Replace(valid[KeyKubernetesComponents], "sha256:", "md5:", 1)), wantErr: "hash"},
		{name: "wrong variant", data: policy(func(s string) string { return strings.Replace(s, "variant: tpm", "variant: tdx", 1) }), wantErr: `variant "tdx" differs`},
		{name: "selection without node-lock PCR", data: policy(func(s string) string { return strings.Replace(s, "[4, 8, 15]", "[4, 8]", 1) }), wantErr: "must include the node-lock PCR 15"},
		{name: "no roles", data: policy(func(s string) string {
			before, _, _ := strings.Cut(s, "roles:")
			_, after, _ := strings.Cut(s, "pinnedAKs:")
			return before + "pinnedAKs:" + after
		}), wantErr: "roles is empty"},
		{name: "unknown role", data: policy(func(s string) string { return strings.Replace(s, "  worker:", "  admin:", 1) }), wantErr: "roles.admin: unknown role"},
		{name: "role without reference values", data: policy(func(s string) string {
			return strings.Replace(s, "  worker:\n    referenceValues:\n      8: {expected: \""+strings.Repeat("f0", 32)+"\"}", "  worker:\n    referenceValues: {}", 1)
		}), wantErr: "roles.worker.referenceValues is empty"},
		{name: "worker evidence could satisfy the control plane", data: policy(func(s string) string {
			return strings.ReplaceAll(s, strings.Repeat("f0", 32), strings.Repeat("c0", 32))
		}),
			wantErr: "must expect different values for at least one PCR"},
		{name: "control-plane difference only warn-only", data: policy(func(s string) string {
			return strings.Replace(s, "8: {expected: \""+strings.Repeat("f0", 32)+"\"}", "8: {expected: \""+strings.Repeat("f0", 32)+"\", warnOnly: true}", 1)
		}), wantErr: "must expect different values for at least one PCR"},
		{name: "role value outside the selection", data: policy(func(s string) string {
			return strings.Replace(s, "      8: {expected: \""+strings.Repeat("f0", 32), "      9: {expected: \""+strings.Repeat("f0", 32), 1)
		}),
			wantErr: "roles.worker.referenceValues sets PCR 9, which pcrs does not select"},
		{name: "role sets the node-lock PCR", data: policy(func(s string) string {
			return strings.Replace(s, "      8: {expected: \""+strings.Repeat("f0", 32)+"\"}", "      8: {expected: \""+strings.Repeat("f0", 32)+"\"}\n      15: {expected: \""+strings.Repeat("00", 32)+"\"}", 1)
		}), wantErr: "roles.worker.referenceValues must not set PCR 15"},
		{name: "node CIDR not a CIDR", data: change(KeyNodeCIDRs, "10.0.0.0/8, nope"), wantErr: `nodeCIDRs: "nope" is not a CIDR`},
		{name: "node CIDR covering everything", data: change(KeyNodeCIDRs, "0.0.0.0/0"), wantErr: "covers every address"},
		{name: "DNS suffix invalid", data: change(KeyNodeDNSSuffixes, "Example_Com"), wantErr: "is not a DNS suffix"},
		{name: "image mirror not JSON", data: change(KeyImageMirror, "mirror.example:5000"), wantErr: "imageMirror: not an image mirror"},
		{name: "image mirror unknown field", data: change(KeyImageMirror, `{"registry":"mirror.example:5000","upstreams":["docker.io"],"insecure":true}`), wantErr: "imageMirror: not an image mirror"},
		{name: "image mirror escaping upstream", data: change(KeyImageMirror, `{"registry":"mirror.example:5000","upstreams":["../x"]}`), wantErr: `imageMirror: image mirror: upstream "../x"`},
		{name: "image mirror registry with scheme", data: change(KeyImageMirror, `{"registry":"http://mirror.example:5000","upstreams":["docker.io"]}`), wantErr: `imageMirror: image mirror: registry "http://mirror.example:5000"`},
		{name: "reference value for the node-lock PCR", data: policy(func(s string) string {
			return strings.Replace(s, "referenceValues:\n", "referenceValues:\n  15: {expected: \""+strings.Repeat("00", 32)+"\"}\n", 1)
		}), wantErr: "must not set PCR 15"},
		{name: "short reference value", data: policy(func(s string) string { return strings.Replace(s, strings.Repeat("ab", 32), "abcd", 1) }), wantErr: "index 4: expected value has 2 bytes, want 32"},
		{name: "unknown field", data: policy(func(s string) string { return s + "extra: 1\n" }), wantErr: "unknown field"},
		{name: "no endorsement", data: change(KeyAttestation, withoutAKs), wantErr: "set exactly one of pinnedAKs"},
		{name: "AK not PEM", data: change(KeyAttestation, withoutAKs+"pinnedAKs: [nope]\n"), wantErr: "pinnedAKs[0] is not a PEM PUBLIC KEY"},
		{name: "AK roots without certificates", data: change(KeyAttestation, withoutAKs+"akRoots: nope\n"), wantErr: "akRoots holds no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseJoinConfig(tt.data, attestation.VariantTPM, time.Now)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if cfg.APIServerEndpoint != "10.0.0.1:6443" || len(cfg.MeasurementSalt) != 32 || len(cfg.Components) != 1 ||
					!strings.Contains(cfg.Summary, "pcrs=[4 8 15]") || !strings.Contains(cfg.Summary, "controlPlane=sha256:") {
					t.Errorf("config %+v", cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestAKRoots(t *testing.T) {
	d := validData(t)
	ca := testkit.NewCA(t, "AK root")
	withoutAKs, _, _ := strings.Cut(d[KeyAttestation], "pinnedAKs")
	d[KeyAttestation] = withoutAKs + "akRoots: |\n" + indent(string(ca.PEM)) + "\n"
	if _, err := ParseJoinConfig(d, attestation.VariantTPM, time.Now); err != nil {
		t.Fatal(err)
	}
}

// FuzzParseJoinConfig checks that no ConfigMap content crashes the parser
// and that an accepted config always enforces the node-lock PCR.
func FuzzParseJoinConfig(f *testing.F) {
	valid := validData(f)
	f.Add(valid[KeyAttestation], valid[KeyKubernetesComponents], valid[KeyMeasurementSalt])
	f.Add("variant: tpm\npcrs: [15]\n", "[]", "")
	f.Fuzz(func(t *testing.T, policy, components, salt string) {
		d := maps.Clone(valid)
		d[KeyAttestation], d[KeyKubernetesComponents], d[KeyMeasurementSalt] = policy, components, salt
		cfg, err := ParseJoinConfig(d, attestation.VariantTPM, time.Now)
		if err == nil && (!strings.Contains(cfg.Summary, "15") || len(cfg.MeasurementSalt) != keys.MeasurementSaltSize) {
			t.Fatalf("accepted config %+v", cfg)
		}
	})
}

// TestContinuousAttestation: the action on failure defaults to tainting,
// restoring automatically after a 5-minute grace for unreachable nodes;
// other settings parse, and a wrong one names the field and the choices.
func TestContinuousAttestation(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       ContinuousAttestation
		err        string
	}{
		{"absent", "", ContinuousAttestation{Action: ActionTaint, Restore: RestoreAuto, UnreachableGrace: metav1.Duration{Duration: 5 * time.Minute}}, ""},
		{"admin restores", "restore: admin\nunreachableGrace: 30s\n", ContinuousAttestation{Action: ActionTaint, Restore: RestoreAdmin, UnreachableGrace: metav1.Duration{Duration: 30 * time.Second}}, ""},
		{"record only", "action: none\n", ContinuousAttestation{Action: actionNone, Restore: RestoreAuto, UnreachableGrace: metav1.Duration{Duration: 5 * time.Minute}}, ""},
		{"unknown action", "action: drain\n", ContinuousAttestation{}, `action "drain": use taint or none`},
		{"unknown field", "actoin: none\n", ContinuousAttestation{}, "actoin"},
		{"negative grace", "unreachableGrace: -1m\n", ContinuousAttestation{}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := validData(t)
			if tc.yaml != "" {
				data[KeyContinuousAttestation] = tc.yaml
			}
			cfg, err := ParseJoinConfig(data, attestation.VariantTPM, time.Now)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), KeyContinuousAttestation) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error naming %s and %q", err, KeyContinuousAttestation, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ContinuousAttestation != tc.want {
				t.Fatalf("got %+v, want %+v", cfg.ContinuousAttestation, tc.want)
			}
		})
	}
}

// TestParseJoinConfigImageMirror: the optional imageMirror key reaches the
// JoinConfig as written; without it joiners get none.
func TestParseJoinConfigImageMirror(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        string // the registry; "" for none
		plainHTTP   bool
	}{
		{name: "absent"},
		{name: "blank", value: " \n"},
		{name: "set", value: `{"registry":"10.88.1.1:5000","plainHttp":true,"upstreams":["registry.k8s.io","docker.io"]}`, want: "10.88.1.1:5000", plainHTTP: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := validData(t)
			if tc.value != "" {
				d[KeyImageMirror] = tc.value
			}
			cfg, err := ParseJoinConfig(d, attestation.VariantTPM, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.ImageMirror.GetRegistry(); got != tc.want || cfg.ImageMirror.GetPlainHttp() != tc.plainHTTP {
				t.Errorf("image mirror %v, want registry %q plainHttp %v", cfg.ImageMirror, tc.want, tc.plainHTTP)
			}
			if tc.want != "" && len(cfg.ImageMirror.GetUpstreams()) != 2 {
				t.Errorf("upstreams %v", cfg.ImageMirror.GetUpstreams())
			}
		})
	}
}
