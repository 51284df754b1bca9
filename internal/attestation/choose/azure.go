package choose

import (
	"errors"
	"net/http"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/azurecvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

// thimTimeout bounds one request for the VCEK to Azure's instance
// metadata service, a link-local service that answers in milliseconds.
const thimTimeout = 10 * time.Second

// azureSNPAttester wraps the vTPM's quote attester (with Azure's AK) into
// the azure-sev-snp attester, fetching the VCEK from o.AzureTHIMURL.
func azureSNPAttester(o AttesterOptions, vtpm *tpmattester.QuoteAttester) (attestation.Attester, error) {
	url := o.AzureTHIMURL
	if url == "" {
		url = azurecvm.DefaultTHIMURL
	}
	return azurecvm.NewAttester(vtpm, azurecvm.THIM(&http.Client{Timeout: thimTimeout}, url))
}

// azureSNPVerifier compiles variant azure-sev-snp: the HCL report's
// SEV-SNP report against the sevSnp section (the paravisor's launch
// measurements; from VMPL 0, where Azure's paravisor runs), and the vTPM
// quote whose key the report's runtime data names.
func azureSNPVerifier(a Appraisal) (attestation.Verifier, error) {
	v := attestation.VariantAzureSNP
	vtpm, err := boundVTPM(v, a)
	if err != nil {
		return nil, err
	}
	// Azure's paravisor runs at VMPL 0.
	paravisorVMPL := 0
	report, err := snpReportVerifier(v, a, "the launch measurements of Azure's paravisor builds and the minimum TCB its reports must show", &paravisorVMPL)
	if err != nil {
		return nil, err
	}
	return azurecvm.NewVerifier(report, vtpm)
}

// azureAKSource is the AK of variant azure-sev-snp: the one Azure's
// paravisor provisions, the key its HCL report names.
func azureAKSource(source string) (tpmattester.AKSource, error) {
	switch tpmattester.AKSource(source) {
	case "", tpmattester.AKAzure:
		return tpmattester.AKAzure, nil
	}
	return "", errors.New("variant azure-sev-snp quotes with the AK Azure's paravisor provisions, the key its HCL report names: use azure (or leave the flag out)")
}
