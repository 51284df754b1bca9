package choose

import (
	"errors"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// tpmVerifier compiles variant tpm: a TPM's quote, under the policy's
// trust in TPM keys.
func tpmVerifier(a Appraisal) (attestation.Verifier, error) {
	if !a.Capture && (a.SEVSNP != nil || a.TDX != nil) {
		return nil, errors.New("variant tpm takes no sevSnp or tdx section")
	}
	if a.EndorsementErr != nil {
		return nil, a.EndorsementErr
	}
	return tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: a.PCRs, ReferenceValues: a.ReferenceValues, Endorsement: a.Endorsement,
		RequireEventLog: a.RequireEventLog}, a.Now)
}
