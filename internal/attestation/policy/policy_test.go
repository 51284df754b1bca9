package policy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

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
		{"GCE and pinned AKs", func(p *policy.Policy) { p.GCE, p.PinnedAKs = &policy.GCEPolicy{Projects: []string{"p"}}, []string{ak} }, "set exactly one of", ""},
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
