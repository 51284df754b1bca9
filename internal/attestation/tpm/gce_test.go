package tpm_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	attestpb "github.com/google/go-tpm-tools/proto/attest"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
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
		v, err := tpm.NewVerifier(tpm.Policy{PCRs: pcrs, Endorsement: tpm.Endorsement{GCE: &gce}}, time.Now)
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

	if _, err := tpm.NewVerifier(tpm.Policy{PCRs: pcrs, Endorsement: tpm.Endorsement{GCE: &tpm.GCEEndorsement{}}}, time.Now); err == nil ||
		!strings.Contains(err.Error(), "at least one allowed project") {
		t.Fatalf("a GCE policy without projects: %v, want refused", err)
	}
}
