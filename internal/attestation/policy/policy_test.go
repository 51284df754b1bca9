package policy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/choose"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// certPEM returns a CA certificate, or with isCA false a leaf it issued, PEM.
func certPEM(t *testing.T, isCA bool) string {
	t.Helper()
	ca := testkit.NewCA(t, "test CA")
	if isCA {
		return string(ca.PEM)
	}
	leaf := ca.Issue(t, "leaf", false)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]}))
}

func akPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}))
}

// nitroRefs is a SHA-384 reference value for pcr.
func nitroRefs(pcr int) []byte {
	return []byte(`{"` + strconv.Itoa(pcr) + `": {"expected": "` + strings.Repeat("ab", 48) + `"}}`)
}

// TestKeyTrust: exactly one way of trusting attestation keys, each
// checked on load with an error naming the field.
func TestKeyTrust(t *testing.T) {
	base := policy.Policy{
		Variant: "tpm", PCRs: []int{4, 15},
		Roles: map[policy.Role]policy.RolePolicy{
			policy.RoleControlPlane: {ReferenceValues: []byte(`{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`)},
		},
	}
	ca, leaf, ak := certPEM(t, true), certPEM(t, false), akPEM(t)
	tests := []struct {
		name    string
		edit    func(*policy.Policy)
		wantErr string
		summary string
	}{
		{"pinned AKs", func(p *policy.Policy) { p.PinnedAKs = []string{ak} }, "", "keys=pinned(1)"},
		{"EK roots", func(p *policy.Policy) { p.EKRoots = ca }, "", "keys=ekRoots:sha256:"},
		{"EK roots and intermediates", func(p *policy.Policy) { p.EKRoots, p.EKIntermediates = ca, ca+ca }, "", "keys=ekRoots:"},
		{"AK roots", func(p *policy.Policy) { p.AKRoots = ca }, "", "keys=akRoots:"},
		{"GCE", func(p *policy.Policy) { p.GCE = &policy.GCEPolicy{Projects: []string{"p"}, Zones: []string{"z"}} }, "", "keys=gce(projects=[p] zones=[z])"},
		{"GCE without projects", func(p *policy.Policy) { p.GCE = &policy.GCEPolicy{} }, "gce.projects is empty", ""},
		{"GCE with its own CA", func(p *policy.Policy) {
			p.GCE = &policy.GCEPolicy{Projects: []string{"p"}, Roots: ca, Intermediates: ca}
		}, "", "keys=gce(projects=[p] zones=[] roots=sha256:"},
		{"GCE roots not PEM", func(p *policy.Policy) { p.GCE = &policy.GCEPolicy{Projects: []string{"p"}, Roots: "x"} }, "gce.roots holds no PEM certificate", ""},
		{"GCE intermediates alone", func(p *policy.Policy) { p.GCE = &policy.GCEPolicy{Projects: []string{"p"}, Intermediates: ca} }, "gce.intermediates is set without gce.roots", ""},
		{"GCE and pinned AKs", func(p *policy.Policy) { p.GCE, p.PinnedAKs = &policy.GCEPolicy{Projects: []string{"p"}}, []string{ak} }, "set exactly one of", ""},
		{"Azure Trusted Launch, certificate IDs", func(p *policy.Policy) {
			p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{CertificateIDs: []string{"2d056151df3d"}}
		}, "", "keys=azureTrustedLaunch(certificateIDs=[2d056151df3d])"},
		{"Azure Trusted Launch, any VM", func(p *policy.Policy) { p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{AnyVM: true} }, "", "keys=azureTrustedLaunch(anyVM)"},
		{"Azure Trusted Launch with its own CAs", func(p *policy.Policy) {
			p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{AnyVM: true, Roots: ca, Intermediates: ca}
		}, "", "keys=azureTrustedLaunch(anyVM roots=sha256:"},
		{"Azure Trusted Launch, a new issuing CA alone", func(p *policy.Policy) {
			p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{AnyVM: true, Intermediates: ca}
		}, "", "keys=azureTrustedLaunch(anyVM intermediates=sha256:"},
		{"Azure Trusted Launch admitting nothing", func(p *policy.Policy) { p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{} },
			"azureTrustedLaunch: set exactly one of certificateIDs", ""},
		{"Azure Trusted Launch, IDs and any VM", func(p *policy.Policy) {
			p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{CertificateIDs: []string{"a"}, AnyVM: true}
		}, "azureTrustedLaunch: set exactly one of certificateIDs", ""},
		{"Azure Trusted Launch, a common name for an ID", func(p *policy.Policy) {
			p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{CertificateIDs: []string{"2d056151df3d.TrustedVM.Azure.Microsoft"}}
		}, "azureTrustedLaunch.certificateIDs[0]", ""},
		{"Azure Trusted Launch roots not PEM", func(p *policy.Policy) {
			p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{AnyVM: true, Roots: "x"}
		}, "azureTrustedLaunch.roots holds no PEM certificate", ""},
		{"Azure Trusted Launch intermediates not PEM", func(p *policy.Policy) {
			p.AzureTrustedLaunch = &policy.AzureTrustedLaunchPolicy{AnyVM: true, Intermediates: leaf}
		}, "azureTrustedLaunch.intermediates: certificate 1 (CN=leaf) is not a CA certificate", ""},
		{"Azure Trusted Launch and GCE", func(p *policy.Policy) {
			p.AzureTrustedLaunch, p.GCE = &policy.AzureTrustedLaunchPolicy{AnyVM: true}, &policy.GCEPolicy{Projects: []string{"p"}}
		}, "set exactly one of", ""},
		{"AWS NitroTPM, any instance", func(p *policy.Policy) {
			p.AWSNitroTPM = &policy.AWSNitroTPMPolicy{AnyInstance: true, ReferenceValues: nitroRefs(4)}
		}, "", "keys=awsNitroTPM(anyInstance referenceValues=sha256:"},
		{"AWS NitroTPM, instance IDs", func(p *policy.Policy) {
			p.AWSNitroTPM = &policy.AWSNitroTPMPolicy{InstanceIDs: []string{"i-01cfb383223e42522"}, ReferenceValues: nitroRefs(4)}
		}, "", "keys=awsNitroTPM(instanceIDs=[i-01cfb383223e42522]"},
		{"AWS NitroTPM admitting nothing", func(p *policy.Policy) { p.AWSNitroTPM = &policy.AWSNitroTPMPolicy{ReferenceValues: nitroRefs(4)} },
			"awsNitroTPM: set exactly one of instanceIDs", ""},
		{"AWS NitroTPM, a name for an instance ID", func(p *policy.Policy) {
			p.AWSNitroTPM = &policy.AWSNitroTPMPolicy{InstanceIDs: []string{"worker-1"}, ReferenceValues: nitroRefs(4)}
		}, "awsNitroTPM.instanceIDs[0]", ""},
		{"AWS NitroTPM without reference values", func(p *policy.Policy) { p.AWSNitroTPM = &policy.AWSNitroTPMPolicy{AnyInstance: true} },
			"awsNitroTPM.referenceValues", ""},
		{"AWS NitroTPM with SHA-256 reference values", func(p *policy.Policy) {
			p.AWSNitroTPM = &policy.AWSNitroTPMPolicy{AnyInstance: true, ReferenceValues: []byte(`{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`)}
		}, "awsNitroTPM.referenceValues", ""},
		{"AWS NitroTPM setting the node lock", func(p *policy.Policy) {
			p.AWSNitroTPM = &policy.AWSNitroTPMPolicy{AnyInstance: true, ReferenceValues: nitroRefs(15)}
		}, "must not set PCR 15", ""},
		{"AWS NitroTPM and GCE", func(p *policy.Policy) {
			p.AWSNitroTPM, p.GCE = &policy.AWSNitroTPMPolicy{AnyInstance: true, ReferenceValues: nitroRefs(4)}, &policy.GCEPolicy{Projects: []string{"p"}}
		}, "set exactly one of", ""},
		{"none", func(*policy.Policy) {}, "set exactly one of pinnedAKs", ""},
		{"two", func(p *policy.Policy) { p.PinnedAKs, p.EKRoots = []string{ak}, ca }, "set exactly one of pinnedAKs", ""},
		{"intermediates alone", func(p *policy.Policy) { p.PinnedAKs, p.EKIntermediates = []string{ak}, ca }, "ekIntermediates is set without ekRoots", ""},
		{"EK roots not PEM", func(p *policy.Policy) { p.EKRoots = "not PEM" }, "ekRoots holds no PEM certificate", ""},
		{"EK root not a CA", func(p *policy.Policy) { p.EKRoots = leaf }, "ekRoots: certificate 1 (CN=leaf) is not a CA certificate", ""},
		{"EK roots holding a key", func(p *policy.Policy) { p.EKRoots = ca + ak }, `ekRoots: block 2 is a "PUBLIC KEY", want CERTIFICATE`, ""},
		{"EK roots with trailing text", func(p *policy.Policy) { p.EKRoots = ca + "junk" }, "ekRoots: text after certificate 1 is not PEM", ""},
		{"EK intermediates not PEM", func(p *policy.Policy) { p.EKRoots, p.EKIntermediates = ca, "x" }, "ekIntermediates holds no PEM certificate", ""},
		{"pinned AK not a key", func(p *policy.Policy) { p.PinnedAKs = []string{ca} }, "pinnedAKs[0] is not a PEM PUBLIC KEY", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base
			tt.edit(&p)
			a, err := p.Appraisal(time.Now, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(a.Summary, tt.summary) {
				t.Fatalf("summary %q does not say %q", a.Summary, tt.summary)
			}
		})
	}
}

// TestConfidentialVMVariants: sev-snp and tdx policies load from their
// hardware sections; each mistake is an error naming the field and what
// is expected, and a key trust field or the other variant's section is
// refused.
func TestConfidentialVMVariants(t *testing.T) {
	m48 := strings.Repeat("ab", 48)
	roles := map[policy.Role]policy.RolePolicy{
		policy.RoleControlPlane: {ReferenceValues: []byte(`{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`)},
	}
	snp := func(edit func(*choose.SEVSNPPolicy)) func(*policy.Policy) {
		return func(p *policy.Policy) {
			p.Variant = "sev-snp"
			p.SEVSNP = &choose.SEVSNPPolicy{LaunchMeasurements: []string{m48}, MinimumTCB: choose.SNPTCB{Bootloader: 3, SNP: 8, Microcode: 115}}
			if edit != nil {
				edit(p.SEVSNP)
			}
		}
	}
	tdx := func(edit func(*choose.TDXPolicy)) func(*policy.Policy) {
		return func(p *policy.Policy) {
			p.Variant = "tdx"
			p.TDX = &choose.TDXPolicy{MRTD: m48}
			if edit != nil {
				edit(p.TDX)
			}
		}
	}
	vmpl := 5
	tests := []struct {
		name    string
		edit    func(*policy.Policy)
		wantErr string
	}{
		{"sev-snp", snp(nil), ""},
		{"sev-snp with everything", snp(func(s *choose.SEVSNPPolicy) {
			s.GuestPolicy = &choose.SNPGuestPolicy{MinimumABI: "1.55"}
			s.IDKeyDigests = []string{m48}
			s.Collateral = &choose.CollateralPolicy{CacheDir: t.TempDir(), Offline: true, CheckRevocations: true}
		}), ""},
		{"tdx", tdx(nil), ""},
		{"tdx with everything", tdx(func(d *choose.TDXPolicy) {
			d.RTMRs = map[int]string{0: m48}
			d.MrSeam, d.TdAttributes, d.Xfam = m48, "0000001000000000", "e702060000000000"
			d.MinimumTeeTcbSvn, d.QeVendorID = strings.Repeat("00", 16), "939a7233f79c4ca9940a0db3957f0607"
			d.Collateral = &choose.CollateralPolicy{CacheDir: t.TempDir(), CheckRevocations: true}
		}), ""},
		{"sev-snp without its section", func(p *policy.Policy) { p.Variant = "sev-snp" }, "variant sev-snp needs a sevSnp section"},
		{"sev-snp with a tdx section", func(p *policy.Policy) { snp(nil)(p); p.TDX = &choose.TDXPolicy{} }, "variant sev-snp takes a sevSnp section, not tdx"},
		{"sev-snp with pinned AKs", func(p *policy.Policy) { snp(nil)(p); p.PinnedAKs = []string{akPEM(t)} }, "trusts the vTPM key its hardware report binds"},
		{"tpm with a sevSnp section", func(p *policy.Policy) { snp(nil)(p); p.Variant = "tpm" }, "variant tpm takes no sevSnp or tdx section"},
		{"no launch measurement", snp(func(s *choose.SEVSNPPolicy) { s.LaunchMeasurements = nil }), "sevSnp.launchMeasurements is empty"},
		{"short launch measurement", snp(func(s *choose.SEVSNPPolicy) { s.LaunchMeasurements = []string{"abcd"} }), "sevSnp.launchMeasurements[0] has 2 bytes, want 48"},
		{"launch measurement not hex", snp(func(s *choose.SEVSNPPolicy) { s.LaunchMeasurements = []string{"xyz"} }), "sevSnp.launchMeasurements[0] is not hex"},
		{"bad ABI", snp(func(s *choose.SEVSNPPolicy) { s.GuestPolicy = &choose.SNPGuestPolicy{MinimumABI: "new"} }), "sevSnp.guestPolicy.minimumABI \"new\": want MAJOR.MINOR"},
		{"bad VMPL", snp(func(s *choose.SEVSNPPolicy) { s.VMPL = &vmpl }), "sevSnp.vmpl 5: want 0-3"},
		{"roots not a cert chain", snp(func(s *choose.SEVSNPPolicy) { s.Roots = []string{"x"} }), "sevSnp.roots[0]: not an AMD KDS cert_chain"},
		{"collateral without a directory", snp(func(s *choose.SEVSNPPolicy) { s.Collateral = &choose.CollateralPolicy{} }), "sevSnp.collateral.cacheDir is empty"},
		{"no MRTD", tdx(func(d *choose.TDXPolicy) { d.MRTD = "" }), "tdx.mrtd is empty"},
		{"RTMR out of range", tdx(func(d *choose.TDXPolicy) { d.RTMRs = map[int]string{4: m48} }), "tdx.rtmrs.4: want an index 0-3"},
		{"debuggable TD attributes", tdx(func(d *choose.TDXPolicy) { d.TdAttributes = "0100000000000000" }), "TD_ATTRIBUTES may not have DEBUG set"},
		{"short XFAM", tdx(func(d *choose.TDXPolicy) { d.Xfam = "00" }), "tdx.xfam has 1 bytes, want 8"},
		{"tdx roots not PEM", tdx(func(d *choose.TDXPolicy) { d.Roots = "x" }), "roots holds no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy.Policy{Variant: "tpm", PCRs: []int{4, 15}, Roles: roles}
			tt.edit(&p)
			a, err := p.Appraisal(time.Now, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(a.Variant()) != p.Variant || !strings.Contains(a.Summary, "variant="+p.Variant) {
				t.Fatalf("variant %s, summary %q", a.Variant(), a.Summary)
			}
		})
	}
}

// TestRequireEventLogDefault: a policy requires the TCG event log when a
// reference value lists expected events, unless it says otherwise.
func TestRequireEventLogDefault(t *testing.T) {
	plain := `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`
	withEvents := `{"4": {"expected": "` + strings.Repeat("ab", 32) + `", "events": [{"type": "EV_IPL", "description": ".cmdline", "digest": "` + strings.Repeat("cd", 32) + `"}]}}`
	yes, no := true, false
	tests := []struct {
		name    string
		common  string
		role    string
		require *bool
		want    string
	}{
		{"no events: not required", "", plain, nil, "requireEventLog=false"},
		{"a role's events: required", "", withEvents, nil, "requireEventLog=true"},
		{"the common values' events: required", withEvents, plain, nil, "requireEventLog=true"},
		{"events, but the policy says not", "", withEvents, &no, "requireEventLog=false"},
		{"no events, but the policy says so", "", plain, &yes, "requireEventLog=true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy.Policy{
				Variant: "tpm", PCRs: []int{4, 15}, PinnedAKs: []string{akPEM(t)}, RequireEventLog: tt.require,
				Roles: map[policy.Role]policy.RolePolicy{policy.RoleControlPlane: {ReferenceValues: []byte(tt.role)}},
			}
			if tt.common != "" {
				p.ReferenceValues = []byte(tt.common)
				p.Roles[policy.RoleControlPlane] = policy.RolePolicy{ReferenceValues: []byte(`{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`)}
			}
			a, err := p.Appraisal(time.Now, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(a.Summary, tt.want) {
				t.Fatalf("summary %q, want %s", a.Summary, tt.want)
			}
		})
	}
	decoded, err := policy.Decode([]byte("variant: tpm\nrequireEventLog: false\n"))
	if err != nil || decoded.RequireEventLog == nil || *decoded.RequireEventLog {
		t.Fatalf("decoding requireEventLog: false: %+v, %v", decoded.RequireEventLog, err)
	}
}

// TestAlsoAccepted: a role is granted by its referenceValues or by any of
// its alsoAccepted sets, each checked as referenceValues is; a
// control-plane set that a worker's set could satisfy is refused naming
// both fields.
func TestAlsoAccepted(t *testing.T) {
	v := func(b byte) string {
		return strings.Repeat(string("0123456789abcdef"[b>>4])+string("0123456789abcdef"[b&15]), 32)
	}
	set := func(pcrs ...string) []byte {
		var parts []string
		for i := 0; i < len(pcrs); i += 2 {
			parts = append(parts, `"`+pcrs[i]+`": {"expected": "`+pcrs[i+1]+`"}`)
		}
		return []byte("{" + strings.Join(parts, ", ") + "}")
	}
	digest := func(b byte) []byte {
		d := make([]byte, 32)
		for i := range d {
			d[i] = b
		}
		return d
	}
	base := func() policy.Policy {
		return policy.Policy{
			Variant: "tpm", PCRs: []int{4, 11, 15}, PinnedAKs: []string{akPEM(t)},
			Roles: map[policy.Role]policy.RolePolicy{
				policy.RoleControlPlane: {ReferenceValues: set("4", v(0xa1)), AlsoAccepted: []json.RawMessage{set("4", v(0xb1), "11", v(0xc1))}},
				policy.RoleWorker:       {ReferenceValues: set("4", v(0xa2)), AlsoAccepted: []json.RawMessage{set("4", v(0xb2), "11", v(0xc2))}},
			},
		}
	}
	p := base()
	a, err := p.Appraisal(time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		measured map[uint32][]byte
		want     []policy.Role
	}{
		{"control plane, referenceValues", map[uint32][]byte{4: digest(0xa1), 11: digest(0)}, []policy.Role{policy.RoleControlPlane}},
		{"control plane, alsoAccepted", map[uint32][]byte{4: digest(0xb1), 11: digest(0xc1)}, []policy.Role{policy.RoleControlPlane}},
		{"worker, alsoAccepted", map[uint32][]byte{4: digest(0xb2), 11: digest(0xc2)}, []policy.Role{policy.RoleWorker}},
		{"half of one set, half of another", map[uint32][]byte{4: digest(0xb1), 11: digest(0xc2)}, nil},
		{"the other role's PCR 11 with this role's PCR 4", map[uint32][]byte{4: digest(0xb2), 11: digest(0xc1)}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := a.Roles(tt.measured); !slices.Equal(got, tt.want) {
				t.Fatalf("roles %v, want %v", got, tt.want)
			}
		})
	}
	if !strings.Contains(a.Summary, "|") {
		t.Errorf("summary %q does not fingerprint both sets of a role", a.Summary)
	}

	for _, tt := range []struct {
		name    string
		edit    func(map[policy.Role]policy.RolePolicy)
		wantErr string
	}{
		{"a control-plane set a worker satisfies", func(r map[policy.Role]policy.RolePolicy) {
			cp := r[policy.RoleControlPlane]
			cp.AlsoAccepted = append(cp.AlsoAccepted, set("4", v(0xb2), "11", v(0xc2)))
			r[policy.RoleControlPlane] = cp
		}, "roles.controlPlane.alsoAccepted[1] and roles.worker.alsoAccepted[0] must expect different values"},
		{"a worker set the control plane's referenceValues satisfy", func(r map[policy.Role]policy.RolePolicy) {
			w := r[policy.RoleWorker]
			w.AlsoAccepted = append(w.AlsoAccepted, set("4", v(0xa1)))
			r[policy.RoleWorker] = w
		}, "roles.controlPlane.referenceValues and roles.worker.alsoAccepted[1] must expect different values"},
		{"an empty set", func(r map[policy.Role]policy.RolePolicy) {
			w := r[policy.RoleWorker]
			w.AlsoAccepted = append(w.AlsoAccepted, []byte(`{}`))
			r[policy.RoleWorker] = w
		}, "roles.worker.alsoAccepted[1] is empty"},
		{"a PCR the policy does not select", func(r map[policy.Role]policy.RolePolicy) {
			w := r[policy.RoleWorker]
			w.AlsoAccepted[0] = set("9", v(1))
			r[policy.RoleWorker] = w
		}, "roles.worker.alsoAccepted[0] sets PCR 9, which pcrs does not select"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := base()
			tt.edit(p.Roles)
			if _, err := p.Appraisal(time.Now, nil); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error saying %q", err, tt.wantErr)
			}
		})
	}

	withEvents := []byte(`{"4": {"expected": "` + v(0xb2) + `", "events": [{"type": "EV_IPL", "description": ".cmdline", "digest": "` + v(0xcd) + `"}]}}`)
	p = base()
	w := p.Roles[policy.RoleWorker]
	w.AlsoAccepted = []json.RawMessage{withEvents}
	p.Roles[policy.RoleWorker] = w
	if a, err := p.Appraisal(time.Now, nil); err != nil || !strings.HasSuffix(a.Summary, "requireEventLog=true") {
		t.Fatalf("an alsoAccepted set with events: %v, summary %v", err, a)
	}
}
