package tpm_test

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/tpmutil"

	attestpb "github.com/google/go-tpm-tools/proto/attest"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

// recordedGCE returns the recorded Compute Engine attestation
// (testdata/README.md) as TPMEvidence of its SHA-256 quote, and the quote's
// extraData.
func recordedGCE(t testing.TB) (evidence []byte, extraData []byte, pcrs []int) {
	t.Helper()
	var att attestpb.Attestation
	if err := proto.Unmarshal(readTestdata(t, "gce-cos-85-nonce9009.pb"), &att); err != nil {
		t.Fatal(err)
	}
	for _, q := range att.GetQuotes() {
		if tpm2.Algorithm(q.GetPcrs().GetHash()) != tpm2.AlgSHA256 {
			continue
		}
		for i := range q.GetPcrs().GetPcrs() {
			pcrs = append(pcrs, int(i))
		}
		ev, err := proto.Marshal(&attestationv1.TPMEvidence{
			Quote: q.GetQuote(), Signature: q.GetRawSig(), PcrHashAlgorithm: uint32(q.GetPcrs().GetHash()), Pcrs: q.GetPcrs().GetPcrs(),
			AttestationKey: att.GetAkPub(), AttestationKeyCertificates: [][]byte{att.GetAkCert()},
		})
		if err != nil {
			t.Fatal(err)
		}
		return ev, []byte{0x90, 0x09}, pcrs
	}
	t.Fatal("the recorded attestation has no SHA-256 quote")
	return nil, nil, nil
}

// TestGCERecordedEvidence: a real Compute Engine vTPM quote with the AK
// certificate Google's CA issued (testdata/README.md) verifies through the
// production verifier with Google's embedded roots, and the instance its
// certificate names becomes part of the result; a project or zone the
// policy does not allow, another CA, a replayed nonce and a tampered PCR
// are refused.
func TestGCERecordedEvidence(t *testing.T) {
	evidence, extraData, pcrs := recordedGCE(t)
	const project = "google.com:wuale-gcp-testing"
	verify := func(t *testing.T, gce tpm.GCEEndorsement, evidence, extraData []byte) (*attestation.Result, error) {
		t.Helper()
		v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: pcrs, Endorsement: tpm.Endorsement{GCE: &gce}}, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		return v.VerifyExtraData(t.Context(), evidence, extraData)
	}

	result, err := verify(t, tpm.GCEEndorsement{Projects: []string{"other-project", project}}, evidence, extraData)
	if err != nil {
		t.Fatalf("recorded Compute Engine evidence: %v", err)
	}
	if !strings.HasPrefix(result.Endorsement, "gce-instance project="+project+" zone=") || !strings.Contains(result.Endorsement, "instance=cos-test ") ||
		!strings.Contains(result.Endorsement, "resource=//compute.googleapis.com/projects/") {
		t.Fatalf("endorsement %q, want the instance the AK certificate names", result.Endorsement)
	}
	if !strings.HasPrefix(result.Identity, "tpm-ak:sha256:") || len(result.Measurements) != len(pcrs) {
		t.Fatalf("identity %q, %d measurements", result.Identity, len(result.Measurements))
	}
	// The instance is an identity of its own, by its never-reused ID.
	if g := result.GCEInstance; g == nil || g.ProjectID != project || g.Name != "cos-test" || g.ID == 0 ||
		!slices.Equal(result.Identities(), []string{result.Identity, fmt.Sprintf("gce-instance:%s/%s/%d", project, g.Zone, g.ID)}) {
		t.Fatalf("instance %+v, identities %q", g, result.Identities())
	}
	zone := strings.Fields(strings.TrimPrefix(result.Endorsement, "gce-instance project="+project+" zone="))[0]
	if _, err := verify(t, tpm.GCEEndorsement{Projects: []string{project}, Zones: []string{zone}}, evidence, extraData); err != nil {
		t.Fatalf("the instance's own zone allowed: %v", err)
	}

	otherRoots := pool(t, "swtpm-localca-root.pem")
	tampered := mutate(t, evidence, func(e *attestationv1.TPMEvidence) { e.Pcrs[0] = make([]byte, 32) })
	for _, tt := range []struct {
		name      string
		gce       tpm.GCEEndorsement
		evidence  []byte
		extraData []byte
		want      error
		says      string
	}{
		{"project not allowed", tpm.GCEEndorsement{Projects: []string{"my-project"}}, evidence, extraData, attestation.ErrPolicy, `in project "` + project + `"`},
		{"zone not allowed", tpm.GCEEndorsement{Projects: []string{project}, Zones: []string{"europe-west3-c"}}, evidence, extraData, attestation.ErrPolicy, "which the policy does not allow (gce.zones"},
		{"another CA", tpm.GCEEndorsement{Projects: []string{project}, Roots: otherRoots}, evidence, extraData, attestation.ErrUntrustedKey, "unknown authority"},
		{"replayed for another nonce", tpm.GCEEndorsement{Projects: []string{project}}, evidence, []byte{0x90, 0x10}, attestation.ErrNonce, "extraData"},
		{"tampered PCR", tpm.GCEEndorsement{Projects: []string{project}}, tampered, extraData, attestation.ErrSignature, "digest"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := verify(t, tt.gce, tt.evidence, tt.extraData)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("got %v, want %v saying %q", err, tt.want, tt.says)
			}
		})
	}

	if _, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: pcrs, Endorsement: tpm.Endorsement{GCE: &tpm.GCEEndorsement{}}}, time.Now); err == nil ||
		!strings.Contains(err.Error(), "at least one allowed project") {
		t.Fatalf("a GCE policy without projects: %v, want refused", err)
	}
}

// gceInstanceInfo is the instance-identity extension Compute Engine's vTPM
// CA puts in AK certificates (as go-tpm-tools' server package parses it).
type gceInstanceInfo struct {
	Zone               string `asn1:"utf8"`
	ProjectNumber      int64
	ProjectID          string `asn1:"utf8"`
	InstanceID         int64
	InstanceName       string `asn1:"utf8"`
	SecurityProperties struct {
		SecurityVersion int64 `asn1:"explicit,tag:0,optional"`
		IsProduction    bool  `asn1:"explicit,tag:1,optional"`
	} `asn1:"explicit,optional"`
}

// nvWrite defines an owner-readable NV index holding data.
func nvWrite(t *testing.T, rw io.ReadWriter, index uint32, data []byte) {
	t.Helper()
	attrs := tpm2.AttrOwnerWrite | tpm2.AttrOwnerRead | tpm2.AttrAuthRead | tpm2.AttrAuthWrite
	if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, tpmutil.Handle(index), "", "", nil, attrs, uint16(len(data))); err != nil {
		t.Fatalf("defining NV index %#x: %v", index, err)
	}
	for off := 0; off < len(data); off += 512 {
		end := min(off+512, len(data))
		if err := tpm2.NVWrite(rw, tpm2.HandleOwner, tpmutil.Handle(index), "", data[off:end], uint16(off)); err != nil {
			t.Fatalf("writing NV index %#x: %v", index, err)
		}
	}
}

// TestGCEAttester: on a TPM provisioned as Compute Engine provisions a
// vTPM (the AK template in NV 0x01c10003, the AK certificate with the
// instance identity in NV 0x01c10002, issued here by a test CA standing in
// for Google's), the attester sends the certificate and the gce policy
// trusts the instance; another project is refused; a TPM without the
// provisioning cannot be used for gce, with an error saying so.
func TestGCEAttester(t *testing.T) {
	rw := newSimulator(t)
	if _, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKGCE}); err == nil ||
		!strings.Contains(err.Error(), "Shielded or Confidential VM") {
		t.Fatalf("a TPM without the Compute Engine AK template: %v", err)
	}
	template, err := client.AKTemplateECC().Encode()
	if err != nil {
		t.Fatal(err)
	}
	nvWrite(t, rw, client.GceAKTemplateNVIndexECC, template)
	ak, err := client.KeyFromNvIndex(rw, tpm2.HandleEndorsement, client.GceAKTemplateNVIndexECC)
	if err != nil {
		t.Fatal(err)
	}
	akPub := ak.PublicKey()
	ak.Close()
	if _, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKGCE}); err == nil ||
		!strings.Contains(err.Error(), "no AK certificate") {
		t.Fatalf("a vTPM without its AK certificate: %v", err)
	}

	ca := testkit.NewCA(t, "test vTPM CA")
	info := gceInstanceInfo{Zone: "europe-west3-a", ProjectNumber: 42, ProjectID: "my-project", InstanceID: 7, InstanceName: "node-1"}
	info.SecurityProperties.IsProduction = true
	infoDER, err := asn1.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "7"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 11129, 2, 1, 21}, Value: infoDER}}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca.Cert, akPub, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	nvWrite(t, rw, client.GceAKCertNVIndexECC, leafDER)

	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKGCE})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	nonce := newNonce(t)
	evidence, err := a.Attest(t.Context(), []byte("tls key"), nonce)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		projects []string
		ok       bool
	}{{"allowed project", []string{"my-project"}, true}, {"another project", []string{"their-project"}, false}} {
		t.Run(tt.name, func(t *testing.T) {
			v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: testPCRs, Endorsement: tpm.Endorsement{GCE: &tpm.GCEEndorsement{Projects: tt.projects, Roots: roots}}}, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			result, err := v.Verify(t.Context(), evidence, nonce)
			if !tt.ok {
				if !errors.Is(err, attestation.ErrPolicy) {
					t.Fatalf("got %v, want ErrPolicy", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(result.Endorsement, "gce-instance project=my-project zone=europe-west3-a instance=node-1 id=7") {
				t.Fatalf("endorsement %q", result.Endorsement)
			}
			if ids := result.Identities(); len(ids) != 2 || ids[1] != "gce-instance:my-project/europe-west3-a/7" {
				t.Fatalf("identities %q, want the AK and the instance", ids)
			}
		})
	}
}
