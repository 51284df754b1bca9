// Package snpguest is the "sev-snp" attester: it asks the AMD secure
// processor, through the guest's /dev/sev-guest or configfs-tsm interface
// (go-sev-guest), for an attestation report bound to the nonce and user data.
// It only works inside an SEV-SNP guest; elsewhere New fails.
package snpguest

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/client"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp"
)

// Attester produces "sev-snp" evidence.
type Attester struct {
	provider client.QuoteProvider
}

// New opens the SEV-SNP guest interface, or fails outside an SEV-SNP guest.
func New() (*Attester, error) {
	provider, err := client.GetQuoteProvider()
	if err != nil {
		return nil, fmt.Errorf("opening the SEV-SNP guest interface: %w", err)
	}
	if !provider.IsSupported() {
		return nil, errors.New("SEV-SNP guest interface not available: not an SEV-SNP guest")
	}
	return &Attester{provider: provider}, nil
}

// Variant returns attestation.VariantSNP.
func (a *Attester) Variant() attestation.Variant { return attestation.VariantSNP }

// Attest requests a report with REPORT_DATA = SHA-512(nonce || userData) and
// returns it with the host's certificate table as marshalled SNPEvidence.
func (a *Attester) Attest(_ context.Context, userData, nonce []byte) ([]byte, error) {
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	var reportData [64]byte
	copy(reportData[:], attestation.Binding512(nonce, userData))
	raw, err := a.provider.GetRawQuote(reportData)
	if err != nil {
		return nil, fmt.Errorf("requesting SEV-SNP report: %w", err)
	}
	if len(raw) < abi.ReportSize {
		return nil, fmt.Errorf("SEV-SNP report has %d bytes, want at least %d", len(raw), abi.ReportSize)
	}
	return snp.Evidence(raw[:abi.ReportSize], raw[abi.ReportSize:], userData)
}
