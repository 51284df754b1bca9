package clusterconfig_test

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// TestGenerateKeyTrust: the generated configuration trusts TPM
// manufacturers when given their CAs, and parses back to the same bundles.
func TestGenerateKeyTrust(t *testing.T) {
	root, inter := string(testkit.NewCA(t, "root").PEM), string(testkit.NewCA(t, "intermediate").PEM)
	data, err := clusterconfig.Generate(clusterconfig.TemplateValues{
		Name: "c", KubernetesVersion: "v1.36.4", ReferenceValues: `{"0": {"expected": "` + strings.Repeat("cd", 32) + `"}}`, PCRs: []int{0, 4, 15},
		RoleReferenceValues: map[policy.Role]string{policy.RoleControlPlane: `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`},
		EKRoots:             root, EKIntermediates: inter, ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clusterconfig.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(cfg.Attestation.EKRoots) != strings.TrimSpace(root) || strings.TrimSpace(cfg.Attestation.EKIntermediates) != strings.TrimSpace(inter) {
		t.Fatalf("the EK CAs did not survive the round trip:\n%s", data)
	}
	if len(cfg.Attestation.PinnedAKs) != 0 || !strings.Contains(string(data), "# How attestation keys are trusted") {
		t.Fatalf("generated configuration:\n%s", data)
	}
	a, err := cfg.Appraisal(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(a.Summary, "keys=ekRoots:") {
		t.Fatalf("summary %q", a.Summary)
	}
}

// TestGenerateGCE: a configuration trusting Compute Engine vTPMs names the
// projects and zones.
func TestGenerateGCE(t *testing.T) {
	data, err := clusterconfig.Generate(clusterconfig.TemplateValues{
		Name: "c", KubernetesVersion: "v1.36.4", ReferenceValues: `{"0": {"expected": "` + strings.Repeat("cd", 32) + `"}}`, PCRs: []int{0, 4, 15},
		RoleReferenceValues: map[policy.Role]string{policy.RoleControlPlane: `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`},
		GCEProjects:         []string{"my-project"}, GCEZones: []string{"europe-west3-a"}, ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clusterconfig.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.Attestation.GCE; g == nil || g.Projects[0] != "my-project" || g.Zones[0] != "europe-west3-a" {
		t.Fatalf("gce policy %+v from:\n%s", g, data)
	}
}

// TestAzureTrustedLaunch: a configuration whose attestation section trusts
// Azure Trusted Launch vTPMs (azureTrustedLaunch, written by hand: the
// generator has no flag for it yet) parses and compiles to a verifier
// saying what it admits; a misspelt field, or a section that admits
// nothing, is refused.
func TestAzureTrustedLaunch(t *testing.T) {
	data, err := clusterconfig.Generate(clusterconfig.TemplateValues{
		Name: "c", KubernetesVersion: "v1.36.4", ReferenceValues: `{"0": {"expected": "` + strings.Repeat("cd", 32) + `"}}`, PCRs: []int{0, 4, 15},
		RoleReferenceValues: map[policy.Role]string{policy.RoleControlPlane: `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`},
		GCEProjects:         []string{"my-project"}, ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
	})
	if err != nil {
		t.Fatal(err)
	}
	gce := "  gce:\n    projects: [\"my-project\"]\n"
	if !bytes.Contains(data, []byte(gce)) {
		t.Fatalf("no gce section to replace in:\n%s", data)
	}
	for _, tc := range []struct {
		section, summary, err string
	}{
		{"  azureTrustedLaunch:\n    certificateIDs: [2d056151df3d]\n", "keys=azureTrustedLaunch(certificateIDs=[2d056151df3d])", ""},
		{"  azureTrustedLaunch:\n    anyVM: true\n", "keys=azureTrustedLaunch(anyVM)", ""},
		{"  azureTrustedLaunch:\n    vms: [2d056151df3d]\n", "", `unknown field "vms"`},
		{"  azureTrustedLaunch: {}\n", "", "azureTrustedLaunch: set exactly one of certificateIDs"},
	} {
		cfg, err := clusterconfig.Parse(bytes.Replace(data, []byte(gce), []byte(tc.section), 1))
		var a *policy.Appraisal
		if err == nil {
			a, err = cfg.Appraisal(nil)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error saying %q", tc.section, err, tc.err)
			}
			continue
		}
		if err != nil || !strings.Contains(a.Summary, tc.summary) {
			t.Errorf("%q: %v, summary %v, want %q", tc.section, err, a, tc.summary)
		}
	}
}

// TestControlPlaneEndpoint: the generated configuration carries the load
// balancer's address, and a malformed one is refused naming the field.
func TestControlPlaneEndpoint(t *testing.T) {
	values := func(endpoint string) clusterconfig.TemplateValues {
		return clusterconfig.TemplateValues{
			Name: "c", KubernetesVersion: "v1.36.4", ReferenceValues: `{"0": {"expected": "` + strings.Repeat("cd", 32) + `"}}`, PCRs: []int{0, 4, 15},
			RoleReferenceValues: map[policy.Role]string{policy.RoleControlPlane: `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`},
			EKRoots:             string(testkit.NewCA(t, "root").PEM), ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
			ControlPlaneEndpoint: endpoint,
		}
	}
	for _, tc := range []struct {
		endpoint, err string
	}{
		{"", ""},
		{"10.88.0.2:6443", ""},
		{"api.example.com:443", ""},
		{"10.88.0.2", "is not host:port"},
		{"10.88.0.2:0", "port \"0\" is not a number in 1..65535"},
		{"10.88.0.2:http", "is not a number"},
		{"bad_host!:6443", "neither an IP address nor a DNS name"},
	} {
		data, err := clusterconfig.Generate(values(tc.endpoint))
		if tc.err == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.endpoint, err)
				continue
			}
			cfg, err := clusterconfig.Parse(data)
			if err != nil || cfg.ControlPlaneEndpoint != tc.endpoint {
				t.Errorf("%q: parsed back as %+v, %v", tc.endpoint, cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "controlPlaneEndpoint: ") || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: got error %v, want one naming controlPlaneEndpoint and %q", tc.endpoint, err, tc.err)
		}
	}
}

// TestKubeletCertificateLifetime: the generated file states the lifetime
// (24 h unless given), and one outside its bounds is refused by name.
func TestKubeletCertificateLifetime(t *testing.T) {
	values := clusterconfig.TemplateValues{
		Name: "c", KubernetesVersion: "v1.36.4", ReferenceValues: `{"0": {"expected": "` + strings.Repeat("cd", 32) + `"}}`, PCRs: []int{0, 4, 15},
		RoleReferenceValues: map[policy.Role]string{policy.RoleControlPlane: `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`},
		EKRoots:             string(testkit.NewCA(t, "root").PEM), ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
	}
	for _, tc := range []struct {
		given, want time.Duration
		err         string
	}{
		{0, 24 * time.Hour, ""},
		{4 * time.Minute, 4 * time.Minute, ""},
		{time.Minute, 0, "kubeletCertificateLifetime: kubelet certificate lifetime 1m0s is not within 2m0s and 8760h0m0s"},
	} {
		values.KubeletCertLifetime = tc.given
		data, err := clusterconfig.Generate(values)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error containing %q", tc.given, err, tc.err)
			}
			continue
		}
		cfg, err := clusterconfig.Parse(data)
		if err != nil || cfg.KubeletCertLifetime() != tc.want {
			t.Errorf("%s: parsed back as %v (%v), want %s", tc.given, cfg.KubeletCertLifetime(), err, tc.want)
		}
	}
}

// TestGenerateAlsoAccepted: a role's further reference values and
// requireEventLog reach the policy.
func TestGenerateAlsoAccepted(t *testing.T) {
	no := false
	data, err := clusterconfig.Generate(clusterconfig.TemplateValues{
		Name: "c", KubernetesVersion: "v1.36.4", ReferenceValues: `{}`, PCRs: []int{4, 8, 11, 15},
		RoleReferenceValues: map[policy.Role]string{
			policy.RoleControlPlane: `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}, "8": {"expected": "` + strings.Repeat("01", 32) + `"}}`,
			policy.RoleWorker:       `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}, "8": {"expected": "` + strings.Repeat("02", 32) + `"}}`,
		},
		RoleAlsoAccepted: map[policy.Role][]string{
			policy.RoleWorker: {`{"4": {"expected": "` + strings.Repeat("cd", 32) + `"}, "11": {"expected": "` + strings.Repeat("ef", 32) + `"}}`},
		},
		RequireEventLog: &no, EKRoots: string(testkit.NewCA(t, "root").PEM), ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clusterconfig.Parse(data)
	if err != nil {
		t.Fatalf("%v:\n%s", err, data)
	}
	a := cfg.Attestation
	if len(a.Roles[policy.RoleWorker].AlsoAccepted) != 1 || len(a.Roles[policy.RoleControlPlane].AlsoAccepted) != 0 {
		t.Fatalf("alsoAccepted %+v from:\n%s", a.Roles, data)
	}
	if a.RequireEventLog == nil || *a.RequireEventLog {
		t.Fatalf("requireEventLog %v from:\n%s", a.RequireEventLog, data)
	}
}

// TestMasterSecretKEK: the generated file documents masterSecretKEK; a KEK
// URI of an external KMS is accepted, anything else is refused by name.
func TestMasterSecretKEK(t *testing.T) {
	values := clusterconfig.TemplateValues{
		Name: "c", KubernetesVersion: "v1.36.4", ReferenceValues: `{"0": {"expected": "` + strings.Repeat("cd", 32) + `"}}`, PCRs: []int{0, 4, 15},
		RoleReferenceValues: map[policy.Role]string{policy.RoleControlPlane: `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`},
		EKRoots:             string(testkit.NewCA(t, "root").PEM), ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
	}
	data, err := clusterconfig.Generate(values)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "# masterSecretKEK:") {
		t.Fatal("the generated configuration does not document masterSecretKEK")
	}
	salt := strings.Repeat("A", 43)
	for _, tc := range []struct{ kek, err string }{
		{kek: "kms://aws-kms?key-id=alias/gatehouse&region=eu-west-1"},
		{kek: "kms://vault-transit?address=https://vault.example:8200&key=gatehouse&token-source=file:/run/vault/token"},
		{kek: "kms://aws-kms?key-id=alias/gatehouse&region=eu-west-1&wrapped=AQID&salt=" + salt, err: "without wrapped and salt"},
		{kek: "kms://cluster-kms?key=" + salt + "&salt=" + salt, err: "give a key-encryption key of an external KMS"},
		{kek: "kms://vault-transit?address=http://vault.example&key=k&token-source=file:/t", err: "plain http is allowed only to a loopback address"},
		{kek: "kms://vault-transit?address=https://vault.example&key=k&token-source=s.abcdef", err: "a token never goes in the URI"},
	} {
		cfgData := append(bytes.Clone(data), []byte("masterSecretKEK: "+strconv.Quote(tc.kek)+"\n")...)
		_, err := clusterconfig.Parse(cfgData)
		if tc.err == "" && err != nil {
			t.Errorf("%s: %v", tc.kek, err)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), "masterSecretKEK: ") || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: error %v, want masterSecretKEK: …%s", tc.kek, err, tc.err)
		}
	}
}
