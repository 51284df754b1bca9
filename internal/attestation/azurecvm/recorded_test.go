package azurecvm_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/azurecvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm/swtpmtest"
)

// trusteeEvidence is the JSON of trustee's recordings (testdata/README.md):
// version 2 holds hex and base64url strings, the older form byte lists.
type trusteeEvidence struct {
	Version   int             `json:"version"`
	TPMQuote  *trusteeQuote   `json:"tpm_quote"`
	Quote     *trusteeQuote   `json:"quote"`
	HCLReport json.RawMessage `json:"hcl_report"`
	Report    json.RawMessage `json:"report"`
	VCEK      string          `json:"vcek"`
}

type trusteeQuote struct {
	Signature json.RawMessage   `json:"signature"`
	Message   json.RawMessage   `json:"message"`
	PCRs      []json.RawMessage `json:"pcrs"`
}

// recording is one recorded Azure confidential VM's evidence in
// Gatehouse's form, and what the test needs to verify it.
type recording struct {
	evidence    []byte
	binding     []byte // the quote's extraData: the report data trustee's verifier was given
	pcrs        map[uint32][]byte
	measurement []byte
	hcl         []byte
}

// bytesOf decodes one of trustee's byte fields: a JSON list of numbers,
// or a string in hex or base64url.
func bytesOf(t testing.TB, raw json.RawMessage) []byte {
	t.Helper()
	var list []byte
	var numbers []int
	if err := json.Unmarshal(raw, &numbers); err == nil {
		for _, n := range numbers {
			list = append(list, byte(n))
		}
		return list
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	if b, err := hex.DecodeString(s); err == nil {
		return b
	}
	b, err := base64.URLEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("%.40s… is neither hex nor base64url: %v", s, err)
	}
	return b
}

// loadRecording turns trustee's recording into AzureCVMEvidence, as
// Gatehouse's attester sends it: the quote's raw RSASSA signature as a
// TPMT_SIGNATURE, and the AK's TPMT_PUBLIC, which trustee does not record,
// made from the HCL report's HCLAkPub key in the template of Azure's vTPM
// AK (an attester reads it from persistent handle 0x81000003). The
// verifier trusts the key, not those bytes: it compares the public key.
func loadRecording(t testing.TB, file string) recording {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var rec trusteeEvidence
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	quote, hclField := rec.TPMQuote, rec.HCLReport
	if quote == nil {
		quote, hclField = rec.Quote, rec.Report
	}
	hcl := bytesOf(t, hclField)
	vcek := []byte(rec.VCEK)
	if block, _ := pem.Decode(vcek); block != nil {
		vcek = block.Bytes
	} else if vcek, err = base64.URLEncoding.DecodeString(rec.VCEK); err != nil {
		t.Fatal(err)
	}
	parsed, err := azurecvm.ParseHCLReport(hcl)
	if err != nil {
		t.Fatal(err)
	}
	runtime, err := azurecvm.ParseRuntimeData(parsed.RuntimeData)
	if err != nil {
		t.Fatal(err)
	}
	ak, err := runtime.AttestationKey()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := tpm2.Signature{Alg: tpm2.AlgRSASSA, RSA: &tpm2.SignatureRSA{HashAlg: tpm2.AlgSHA256, Signature: bytesOf(t, quote.Signature)}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	pcrs := map[uint32][]byte{}
	for i, p := range quote.PCRs {
		pcrs[uint32(i)] = bytesOf(t, p)
	}
	message := bytesOf(t, quote.Message)
	vtpm, err := proto.Marshal(&attestationv1.TPMEvidence{
		Quote: message, Signature: sig, PcrHashAlgorithm: uint32(tpm2.AlgSHA256), Pcrs: pcrs,
		AttestationKey: swtpmtest.AzureAKPublic(t, ak),
	})
	if err != nil {
		t.Fatal(err)
	}
	evidence, err := proto.Marshal(&attestationv1.AzureCVMEvidence{Vtpm: vtpm, HclReport: hcl, Vcek: vcek})
	if err != nil {
		t.Fatal(err)
	}
	return recording{evidence: evidence, binding: extraData(t, message), pcrs: pcrs, hcl: hcl,
		measurement: parsed.SNPReport[0x90 : 0x90+snp.MeasurementSize]}
}

// extraData reads a TPMS_ATTEST's extraData (TPM 2.0 Part 2, 10.12.12).
func extraData(t testing.TB, attest []byte) []byte {
	t.Helper()
	signer := int(binary.BigEndian.Uint16(attest[6:]))
	at := 8 + signer
	n := int(binary.BigEndian.Uint16(attest[at:]))
	return attest[at+2 : at+2+n]
}

// recordedTime is a time the recorded VCEKs (2025-01 to 2032-01) are valid.
var recordedTime = time.Date(2026, time.June, 1, 0, 0, 0, 0, time.UTC)

func newVerifier(t testing.TB, rec recording, mutate func(*snp.ReportPolicy)) *azurecvm.Verifier {
	t.Helper()
	vmpl := 0
	policy := snp.ReportPolicy{LaunchMeasurements: [][]byte{rec.measurement}, VMPL: &vmpl}
	if mutate != nil {
		mutate(&policy)
	}
	now := func() time.Time { return recordedTime }
	report, err := snp.NewReportVerifier(policy, now)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := make([]int, 24)
	reference := measurements.M{}
	for i := range pcrs {
		pcrs[i] = i
		reference[uint32(i)] = measurements.Measurement{Expected: rec.pcrs[uint32(i)]}
	}
	vtpm, err := tpm.NewBoundVerifier(tpm.QuotePolicy{PCRs: pcrs, ReferenceValues: reference}, now)
	if err != nil {
		t.Fatal(err)
	}
	v, err := azurecvm.NewVerifier(report, vtpm)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRecordedEvidence: a real Azure confidential VM's evidence (trustee's
// evidence-v2.json: an AMD EPYC Milan host, testdata/README.md) verifies
// through the production verifier with AMD's real roots embedded in
// go-sev-guest and only the VCEK from the evidence: the SEV-SNP report's
// signature and chain, REPORT_DATA = SHA-256(runtime data), the runtime
// data's user-data and the quote's extraData both the recorded binding,
// the quote signed by the runtime data's HCLAkPub key, the PCRs. The
// recording was made for trustee's report data, not a Gatehouse nonce, so
// the test calls VerifyBinding with it; Verify with a nonce refuses it.
// Each refusal below is one thing an attacker would change.
func TestRecordedEvidence(t *testing.T) {
	rec := loadRecording(t, "evidence-v2.json")
	v := newVerifier(t, rec, nil)
	result, err := v.VerifyBinding(t.Context(), rec.evidence, rec.binding)
	if err != nil {
		t.Fatalf("recorded Azure confidential VM evidence: %v", err)
	}
	if result.Variant != attestation.VariantAzureSNP || !strings.HasPrefix(result.Identity, attestation.PrefixAK) || len(result.Measurements) != 24 ||
		result.Hardware == nil || !strings.HasPrefix(result.Hardware.Identity, attestation.PrefixSNPChip) {
		t.Fatalf("result: variant %s, identity %q, %d measurements, hardware %+v", result.Variant, result.Identity, len(result.Measurements), result.Hardware)
	}
	for _, want := range []string{"vmUniqueId=7DF7B373-B947-4AAA-96E5-C358F2A03D20", "secureBoot=true", "vmpl=0", hex.EncodeToString(rec.measurement)} {
		if !strings.Contains(result.Endorsement, want) {
			t.Errorf("endorsement %q lacks %q", result.Endorsement, want)
		}
	}

	genoa := loadRecording(t, "evidence-genoa.json")
	otherKey := mutateEvidence(t, rec.evidence, func(e *attestationv1.AzureCVMEvidence) {
		e.Vtpm = mutateVTPM(t, e.Vtpm, func(q *attestationv1.TPMEvidence) {
			other, err := azurecvm.ParseHCLReport(genoa.hcl)
			if err != nil {
				t.Fatal(err)
			}
			runtime, err := azurecvm.ParseRuntimeData(other.RuntimeData)
			if err != nil {
				t.Fatal(err)
			}
			key, err := runtime.AttestationKey()
			if err != nil {
				t.Fatal(err)
			}
			q.AttestationKey = swtpmtest.AzureAKPublic(t, key)
		})
	})
	for _, tt := range []struct {
		name     string
		v        *azurecvm.Verifier
		evidence []byte
		binding  []byte
		want     error
		says     string
	}{
		{"another launch measurement (not the paravisor the policy names)", newVerifier(t, rec, func(p *snp.ReportPolicy) {
			p.LaunchMeasurements = [][]byte{make([]byte, snp.MeasurementSize)}
		}), rec.evidence, rec.binding, attestation.ErrMeasurement, "launch measurement"},
		{"a tampered SEV-SNP report", v, mutateHCL(t, rec.evidence, func(b []byte) { b[32+0x90] ^= 1 }), rec.binding, attestation.ErrSignature, "signature"},
		{"tampered runtime data (another AK swapped in)", v, mutateHCL(t, rec.evidence, func(b []byte) {
			i := strings.Index(string(b), `"n":"`) + 10
			b[i] ^= 1
		}), rec.binding, attestation.ErrNonce, "REPORT_DATA"},
		{"another chip's VCEK", v, mutateEvidence(t, rec.evidence, func(e *attestationv1.AzureCVMEvidence) {
			e.Vcek = mustEvidence(t, genoa.evidence).GetVcek()
		}), rec.binding, attestation.ErrSignature, "signature"},
		{"another binding (a replay for another nonce)", v, rec.evidence, make([]byte, 48), attestation.ErrNonce, "user-data"},
		{"a quote by another key than the report's AK", v, otherKey, rec.binding, attestation.ErrUntrustedKey, "not the key the hardware report binds"},
		{"a tampered PCR", v, mutateEvidence(t, rec.evidence, func(e *attestationv1.AzureCVMEvidence) {
			e.Vtpm = mutateVTPM(t, e.Vtpm, func(q *attestationv1.TPMEvidence) { q.Pcrs[7] = make([]byte, 32) })
		}), rec.binding, attestation.ErrSignature, "digest"},
		{"a tampered quote signature", v, mutateEvidence(t, rec.evidence, func(e *attestationv1.AzureCVMEvidence) {
			e.Vtpm = mutateVTPM(t, e.Vtpm, func(q *attestationv1.TPMEvidence) { q.Signature[len(q.Signature)-1] ^= 1 })
		}), rec.binding, attestation.ErrSignature, "does not verify"},
		{"a report from VMPL 1 demanded", newVerifier(t, rec, func(p *snp.ReportPolicy) { one := 1; p.VMPL = &one }), rec.evidence, rec.binding, attestation.ErrPolicy, "VMPL"},
		// trustee's Genoa recording: its report's signature and Genoa chain
		// verify, but the guest asked for it with no user data, so it binds
		// no nonce; refused after the hardware checks passed.
		{"a report asked for without the binding (Genoa recording)", newVerifier(t, genoa, nil), genoa.evidence, genoa.binding, attestation.ErrNonce, "user-data"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.v.VerifyBinding(t.Context(), tt.evidence, tt.binding)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("error = %v, want %v saying %q", err, tt.want, tt.says)
			}
		})
	}
	t.Run("Verify with a nonce refuses the recording (made for trustee's report data)", func(t *testing.T) {
		if _, err := v.Verify(t.Context(), rec.evidence, make([]byte, attestation.NonceSize)); !errors.Is(err, attestation.ErrNonce) {
			t.Fatalf("error = %v, want %v", err, attestation.ErrNonce)
		}
	})
}

func mustEvidence(t *testing.T, evidence []byte) *attestationv1.AzureCVMEvidence {
	t.Helper()
	ev := &attestationv1.AzureCVMEvidence{}
	if err := proto.Unmarshal(evidence, ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

func mutateEvidence(t *testing.T, evidence []byte, f func(*attestationv1.AzureCVMEvidence)) []byte {
	t.Helper()
	ev := mustEvidence(t, evidence)
	f(ev)
	out, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mutateHCL(t *testing.T, evidence []byte, f func([]byte)) []byte {
	t.Helper()
	return mutateEvidence(t, evidence, func(e *attestationv1.AzureCVMEvidence) { f(e.HclReport) })
}

func mutateVTPM(t *testing.T, vtpm []byte, f func(*attestationv1.TPMEvidence)) []byte {
	t.Helper()
	q := &attestationv1.TPMEvidence{}
	if err := proto.Unmarshal(vtpm, q); err != nil {
		t.Fatal(err)
	}
	f(q)
	out, err := proto.Marshal(q)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// FuzzVerifyBinding feeds the verifier mutations of the recorded real
// evidence: it must never panic, and nothing but the recording verifies
// (a mutation that still verifies must leave the signed parts as they
// were, so the result is the recording's AK).
func FuzzVerifyBinding(f *testing.F) {
	rec := loadRecording(f, "evidence-v2.json")
	f.Add(rec.evidence)
	f.Add(mustHCLOnly(f, rec))
	v := newVerifier(f, rec, nil)
	want, err := v.VerifyBinding(f.Context(), rec.evidence, rec.binding)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, evidence []byte) {
		result, err := v.VerifyBinding(t.Context(), evidence, rec.binding)
		if err == nil && result.Identity != want.Identity {
			t.Fatalf("evidence verified as %s", result.Identity)
		}
	})
}

// FuzzParseHCLReport: any bytes parse or fail without panicking, and a
// parsed report's parts lie within the input.
func FuzzParseHCLReport(f *testing.F) {
	f.Add(loadRecording(f, "evidence-v2.json").hcl)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := azurecvm.ParseHCLReport(b)
		if err != nil {
			return
		}
		if len(r.SNPReport) != 1184 || len(r.RuntimeData) > len(b) {
			t.Fatalf("parsed %d-byte report, %d bytes of runtime data from %d bytes", len(r.SNPReport), len(r.RuntimeData), len(b))
		}
		if rd, err := azurecvm.ParseRuntimeData(r.RuntimeData); err == nil {
			_, _ = rd.AttestationKey()
			_ = rd.CheckUserData(make([]byte, 32))
		}
	})
}

// mustHCLOnly is evidence with the HCL report but no VCEK, a seed for the
// verifier's missing-certificate path.
func mustHCLOnly(f *testing.F, rec recording) []byte {
	f.Helper()
	ev := &attestationv1.AzureCVMEvidence{}
	if err := proto.Unmarshal(rec.evidence, ev); err != nil {
		f.Fatal(err)
	}
	ev.Vcek = nil
	out, err := proto.Marshal(ev)
	if err != nil {
		f.Fatal(err)
	}
	return out
}
