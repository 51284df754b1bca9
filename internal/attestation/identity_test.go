package attestation

import (
	"math/big"
	"slices"
	"strings"
	"testing"
)

// TestIdentities: a result proves its attesting key, the EK certificate
// and Compute Engine instance that vouch for it, and its hardware's host,
// each in the one spelling a deny list matches; a host a report does not
// name is left out.
func TestIdentities(t *testing.T) {
	ak := "tpm-ak:sha256:" + strings.Repeat("ab", 32)
	// SHA-256 of the empty string: an issuer's digest.
	emptyDigest := "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	for _, tt := range []struct {
		name   string
		result *Result
		want   []string
	}{
		{"no result", nil, nil},
		{"attestation key only", &Result{Identity: ak}, []string{ak}},
		{"EK certificate", &Result{Identity: ak, EKCertificate: &CertificateName{Issuer: []byte{}, Serial: big.NewInt(0x0a1b)}},
			[]string{ak, "tpm-ek:" + emptyDigest + ":a1b"}},
		{"EK certificate with serial zero", &Result{Identity: ak, EKCertificate: &CertificateName{Issuer: []byte{}}},
			[]string{ak, "tpm-ek:" + emptyDigest + ":0"}},
		{"Compute Engine instance", &Result{Identity: ak, GCEInstance: &GCEInstance{ProjectID: "google.com:p", Zone: "us-central1-a", Name: "n", ID: 7}},
			[]string{ak, "gce-instance:google.com:p/us-central1-a/7"}},
		{"SEV-SNP chip", &Result{Identity: ak, Hardware: &Result{Identity: "sev-snp-chip:0102"}}, []string{ak, "sev-snp-chip:0102"}},
		{"hardware naming no host", &Result{Identity: ak, Hardware: &Result{}}, []string{ak}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.result.Identities(); !slices.Equal(got, tt.want) {
				t.Fatalf("Identities() = %q, want %q", got, tt.want)
			}
		})
	}
}
