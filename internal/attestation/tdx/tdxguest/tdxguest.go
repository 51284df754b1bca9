// Package tdxguest is the TDX attester: it asks the TDX module, through
// the guest's configfs-tsm interface (go-tdx-guest), for a quote bound to the
// nonce and user data (in Gatehouse the vTPM attestation key, see package
// cvm). It only works inside a TDX guest; elsewhere New fails.
package tdxguest

import (
	"context"
	"fmt"

	"github.com/google/go-tdx-guest/client"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx"
)

// TDQuoteAttester produces "tdx" evidence.
type TDQuoteAttester struct {
	provider client.QuoteProvider
}

// New opens the TDX guest interface, or fails outside a TDX guest.
func New() (*TDQuoteAttester, error) {
	provider, err := client.GetQuoteProvider()
	if err != nil {
		return nil, fmt.Errorf("opening the TDX guest interface: %w", err)
	}
	if err := provider.IsSupported(); err != nil {
		return nil, fmt.Errorf("TDX guest interface not available (not a TDX guest?): %w", err)
	}
	return NewWithProvider(provider)
}

// NewWithProvider returns an attester using provider, e.g. a test quote
// provider (package tdxtest).
func NewWithProvider(provider client.QuoteProvider) (*TDQuoteAttester, error) {
	if provider == nil {
		return nil, fmt.Errorf("no TDX quote provider")
	}
	if err := provider.IsSupported(); err != nil {
		return nil, fmt.Errorf("TDX quote provider not available: %w", err)
	}
	return &TDQuoteAttester{provider: provider}, nil
}

// Variant returns attestation.VariantTDX.
func (a *TDQuoteAttester) Variant() attestation.Variant { return attestation.VariantTDX }

// Attest requests a quote with REPORTDATA = SHA-512(nonce || userData) and
// returns it as marshalled TDXEvidence.
func (a *TDQuoteAttester) Attest(_ context.Context, userData, nonce []byte) ([]byte, error) {
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	var reportData [64]byte
	copy(reportData[:], attestation.Binding512(nonce, userData))
	raw, err := client.GetRawQuote(a.provider, reportData)
	if err != nil {
		return nil, fmt.Errorf("requesting TDX quote: %w", err)
	}
	return tdx.Evidence(raw, userData)
}
