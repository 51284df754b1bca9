package azurecvm

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// The vTPM NV indices of Azure's paravisor: the guest writes 64 bytes of
// user data to the request index, and the report index then holds an HCL
// report whose runtime data carries them (Azure confidential VM guest
// attestation; azure-cvm-tooling's az-cvm-vtpm).
const (
	hclReportNV   = tpmutil.Handle(0x01400001)
	hclUserDataNV = tpmutil.Handle(0x01400002)
)

// DefaultTHIMURL is where Azure's instance metadata service serves the
// VCEK of the chip a confidential VM runs on (the Trusted Hardware
// Identity Management cache; the request needs "Metadata: true").
const DefaultTHIMURL = "http://169.254.169.254/metadata/THIM/amd/certification"

// maxTHIMResponse bounds the THIM answer read (a VCEK and the AMD chain
// in PEM: about 6 KiB).
const maxTHIMResponse = 64 << 10

// Quoter is the vTPM attester the Attester adds the HCL report to: it
// quotes with the paravisor's AK (tpmattester.QuoteAttester with
// AKAzure) and lends its TPM to commands that must not interleave with
// its own.
type Quoter interface {
	attestation.Attester
	WithTPM(ctx context.Context, f func(rw io.ReadWriter) error) error
}

// VCEKSource returns the DER VCEK certificate of the chip the VM runs on.
type VCEKSource func(ctx context.Context) ([]byte, error)

// Attester produces "azure-sev-snp" evidence on an Azure confidential VM.
// Safe for concurrent use: the HCL report's write and read run while no
// other command of the vTPM does.
type Attester struct {
	vtpm Quoter
	vcek VCEKSource
}

// NewAttester returns an attester quoting with vtpm and fetching the VCEK
// from vcek (THIM on Azure).
func NewAttester(vtpm Quoter, vcek VCEKSource) (*Attester, error) {
	if vtpm == nil || vcek == nil {
		return nil, errors.New("azure-sev-snp attester needs the vTPM's quote attester and a VCEK source")
	}
	if v := vtpm.Variant(); v != attestation.VariantTPM {
		return nil, fmt.Errorf("azure-sev-snp attester: the vTPM attester is %q, want %s", v, attestation.VariantTPM)
	}
	return &Attester{vtpm: vtpm, vcek: vcek}, nil
}

// Variant returns attestation.VariantAzureSNP.
func (a *Attester) Variant() attestation.Variant { return attestation.VariantAzureSNP }

// Attest asks the paravisor for an HCL report bound to SHA-256(nonce ||
// userData), quotes the vTPM with the same binding, and adds the chip's
// VCEK. Errors name the step that failed.
func (a *Attester) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	binding := attestation.Binding256(nonce, userData)
	var hcl []byte
	if err := a.vtpm.WithTPM(ctx, func(rw io.ReadWriter) error {
		var err error
		hcl, err = readHCLReport(rw, binding)
		return err
	}); err != nil {
		return nil, err
	}
	quote, err := a.vtpm.Attest(ctx, userData, nonce)
	if err != nil {
		return nil, fmt.Errorf("quoting the vTPM: %w", err)
	}
	vcek, err := a.vcek(ctx)
	if err != nil {
		return nil, fmt.Errorf("fetching the VCEK: %w", err)
	}
	return proto.Marshal(&attestationv1.AzureCVMEvidence{Vtpm: quote, HclReport: hcl, Vcek: vcek})
}

// readHCLReport asks the paravisor behind the vTPM rw for an HCL report
// bound to binding (at most 64 bytes): it writes binding, zero-padded, to
// NV index 0x01400002 (defining it, 64 bytes under owner authorisation,
// if the vTPM has none yet) and reads NV index 0x01400001.
func readHCLReport(rw io.ReadWriter, binding []byte) ([]byte, error) {
	data, err := userDataFor(binding)
	if err != nil {
		return nil, err
	}
	if _, err := tpm2.NVReadPublic(rw, hclUserDataNV); err != nil {
		if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, hclUserDataNV, "", "", nil,
			tpm2.AttrOwnerWrite|tpm2.AttrOwnerRead, uint16(len(data))); err != nil {
			return nil, fmt.Errorf("defining the HCL user data NV index %#x: %w", hclUserDataNV, err)
		}
	}
	if err := tpm2.NVWrite(rw, tpm2.HandleOwner, hclUserDataNV, "", data, 0); err != nil {
		return nil, fmt.Errorf("writing the HCL user data to NV index %#x: %w", hclUserDataNV, err)
	}
	report, err := tpm2.NVReadEx(rw, hclReportNV, tpm2.HandleOwner, "", 0)
	if err != nil {
		return nil, fmt.Errorf("reading the HCL report from NV index %#x (is this an Azure confidential VM?): %w", hclReportNV, err)
	}
	return report, nil
}

// THIM returns a VCEKSource asking Azure's instance metadata service at
// url (DefaultTHIMURL) with client.
func THIM(client *http.Client, url string) VCEKSource {
	return func(ctx context.Context) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Metadata", "true")
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("asking THIM for the VCEK: %w", err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxTHIMResponse+1))
		if err != nil {
			return nil, fmt.Errorf("reading THIM's answer: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("THIM at %s answered %s", url, resp.Status)
		}
		return parseTHIM(body)
	}
}

// parseTHIM returns the DER VCEK of THIM's JSON answer (its "vcekCert",
// PEM). Errors say what is missing.
func parseTHIM(body []byte) ([]byte, error) {
	if len(body) > maxTHIMResponse {
		return nil, fmt.Errorf("THIM's answer exceeds %d bytes", maxTHIMResponse)
	}
	var answer struct {
		VCEKCert string `json:"vcekCert"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return nil, fmt.Errorf("THIM's answer is not JSON: %w", err)
	}
	block, _ := pem.Decode([]byte(answer.VCEKCert))
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("THIM's answer has no PEM certificate in vcekCert")
	}
	return block.Bytes, nil
}
