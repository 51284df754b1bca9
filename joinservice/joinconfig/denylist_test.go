package joinconfig

import (
	"math/big"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

var (
	testAK   = "tpm-ak:sha256:" + strings.Repeat("ab", 32)
	testChip = "sev-snp-chip:" + strings.Repeat("c1", 64)
	testPPID = "tdx-ppid:" + strings.Repeat("d2", 16)
)

// testResult is what a Compute Engine vTPM whose AK an EK certificate
// endorses proves, on an SEV-SNP chip: one identity of each kind.
func testResult() *attestation.Result {
	return &attestation.Result{
		Identity:      testAK,
		EKCertificate: &attestation.CertificateName{Issuer: []byte("issuer DER"), Serial: big.NewInt(0x1a2b)},
		GCEInstance:   &attestation.GCEInstance{ProjectID: "my-project", Zone: "europe-west3-a", Name: "node-1", ID: 4567890123456789012},
		Hardware:      &attestation.Result{Identity: testChip},
	}
}

// TestDenyListMatchesEveryIdentity: an entry of each form denies a caller
// whose evidence proves that identity, whichever of its identities it is,
// however the entry's hex is cased or its serial padded, and names the
// entry; a caller proving none of them is not denied.
func TestDenyListMatchesEveryIdentity(t *testing.T) {
	r := testResult()
	ids := r.Identities()
	ek := ids[1]
	issuer, serial, _ := strings.Cut(strings.TrimPrefix(ek, "tpm-ek:"), ":")
	for _, tt := range []struct {
		name, entry string
		identities  []string
		node        string
		want        string
	}{
		{"attestation key", testAK, ids, "worker-1", testAK},
		{"attestation key hex in upper case", "tpm-ak:sha256:" + strings.ToUpper(strings.Repeat("ab", 32)), ids, "", testAK},
		{"EK certificate", ek, ids, "", ek},
		{"EK certificate, serial as openssl prints it", "tpm-ek:" + strings.ToUpper(issuer) + ":00" + strings.ToUpper(serial), ids, "", ek},
		{"EK certificate of another issuer", "tpm-ek:" + strings.Repeat("0", 64) + ":" + serial, ids, "", ""},
		{"SEV-SNP chip", testChip, ids, "", testChip},
		{"TDX platform", testPPID, []string{testAK, testPPID}, "", testPPID},
		{"Compute Engine instance", "gce-instance:my-project/europe-west3-a/4567890123456789012", ids, "", "gce-instance:my-project/europe-west3-a/4567890123456789012"},
		{"Compute Engine instance of another ID", "gce-instance:my-project/europe-west3-a/4567890123456789013", ids, "", ""},
		{"EC2 instance (NitroTPM)", "aws-instance:I-01CFB383223E42522", []string{testAK, "aws-instance:i-01cfb383223e42522"}, "", "aws-instance:i-01cfb383223e42522"},
		{"another EC2 instance", "aws-instance:i-01cfb383223e42523", []string{testAK, "aws-instance:i-01cfb383223e42522"}, "", ""},
		{"node name", "node:worker-9", ids, "worker-9", "node:worker-9"},
		{"node name, request without one", "node:worker-9", ids, "", ""},
		{"another node", "node:worker-9", ids, "worker-1", ""},
		{"no identities", testAK, nil, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ParseDenyList("# revoked after the incident\n" + tt.entry + "  # node 7\n")
			if err != nil {
				t.Fatal(err)
			}
			entry, denied := d.DeniesAny(tt.identities, tt.node)
			if entry != tt.want || denied != (tt.want != "") {
				t.Fatalf("DeniesAny(%q, %q) = %q, %t; want %q", tt.identities, tt.node, entry, denied, tt.want)
			}
		})
	}
}

// TestParseDenyListRefusesEntriesThatMatchNothing: an entry of an unknown
// form, or one no evidence could prove (wrong length, not hex, a name
// where an ID belongs), is an error naming its line and what is wrong:
// such an entry would deny nothing while the administrator believes the
// machine is denied.
func TestParseDenyListRefusesEntriesThatMatchNothing(t *testing.T) {
	for _, tt := range []struct {
		name, line, says string
	}{
		{"no prefix", "worker-9", "none of the entry forms"},
		{"empty node", "node:", "node:<node name>"},
		{"node name in upper case", "node:Worker-9", "lowercase"},
		{"SHA-1 attestation key", "tpm-ak:sha1:abcd", "none of the entry forms"},
		{"prefix in upper case", "TPM-AK:SHA256:" + strings.Repeat("ab", 32), "none of the entry forms"},
		{"short attestation key", "tpm-ak:sha256:abcd", "4 characters, want 64 hex digits"},
		{"attestation key not hex", "tpm-ak:sha256:" + strings.Repeat("zz", 32), "not hex"},
		{"short chip ID", "sev-snp-chip:0102", "want 128 hex digits"},
		{"empty PPID", "tdx-ppid:", "want 32 hex digits"},
		{"EK without serial", "tpm-ek:" + strings.Repeat("ab", 32), "no ':'"},
		{"EK with empty serial", "tpm-ek:" + strings.Repeat("ab", 32) + ":", "serial number"},
		{"EK with an issuer name, not its digest", "tpm-ek:CN=Infineon:1a", "issuer digest"},
		{"GCE instance by name", "gce-instance:my-project/europe-west3-a/node-1", "not a decimal number"},
		{"GCE instance without zone", "gce-instance:my-project/4567", "want 3"},
		{"GCE project with a space", "gce-instance:my project/europe-west3-a/4567", "project ID"},
		{"GCE instance ID over 64 bits", "gce-instance:p/z/18446744073709551616", "not a decimal number"},
		{"EC2 instance by name", "aws-instance:worker-1", "not an EC2 instance ID"},
		{"EC2 instance ID with its NitroTPM suffix", "aws-instance:i-01cfb383223e42522-tpm0000000000000000", "not an EC2 instance ID"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseDenyList("tpm-ak:sha256:" + strings.Repeat("ab", 32) + "\n\n" + tt.line + "\n")
			if err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("ParseDenyList(%q) = %v, want an error naming line 3 and %q", tt.line, err, tt.says)
			}
		})
	}
}

// TestIdentitiesParseAsEntries: every identity a Result proves is an entry
// ParseDenyList accepts unchanged, so an administrator can paste what
// gatehouse verify prints.
func TestIdentitiesParseAsEntries(t *testing.T) {
	ids := testResult().Identities()
	if len(ids) != 4 {
		t.Fatalf("identities %q, want AK, EK, GCE instance and chip", ids)
	}
	for _, id := range append(ids, testPPID) {
		d, err := ParseDenyList(id)
		if err != nil {
			t.Fatalf("identity %q: %v", id, err)
		}
		if entry, denied := d.DeniesAny([]string{id}, ""); !denied || entry != id {
			t.Fatalf("identity %q is not denied by its own entry (%q)", id, entry)
		}
	}
}

// FuzzParseDenyList checks the deny list parser on arbitrary text: it
// never panics, accepts at most one entry a line, and every entry it
// accepts denies what it names, whatever the case of its hex digits.
func FuzzParseDenyList(f *testing.F) {
	f.Add("tpm-ak:sha256:" + strings.Repeat("ab", 32) + "\nnode:worker-1 # x\n")
	for _, id := range testResult().Identities() {
		f.Add(id + "\n" + testPPID)
	}
	f.Add("tpm-ek:" + strings.Repeat("AB", 32) + ":000A\n")
	f.Fuzz(func(t *testing.T, text string) {
		d, err := ParseDenyList(text)
		if err != nil {
			return
		}
		if d.Len() > strings.Count(text, "\n")+1 {
			t.Fatalf("%d entries from %d lines", d.Len(), strings.Count(text, "\n")+1)
		}
		for entry := range d.entries {
			again, err := ParseDenyList(entry)
			if err != nil || again.Len() != 1 || !again.entries[entry] {
				t.Fatalf("canonical entry %q does not parse to itself: %v", entry, err)
			}
			node, isNode := strings.CutPrefix(entry, prefixNode)
			if isNode {
				if _, denied := d.DeniesAny(nil, node); !denied {
					t.Fatalf("entry %q does not deny node %q", entry, node)
				}
			} else if _, denied := d.DeniesAny([]string{entry}, ""); !denied {
				t.Fatalf("entry %q does not deny itself", entry)
			}
		}
	})
}
