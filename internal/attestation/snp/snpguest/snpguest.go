// Package snpguest is the SEV-SNP attester: it asks the AMD secure
// processor, through the guest's configfs-tsm interface or the older
// /dev/sev-guest device (go-sev-guest), for an attestation report bound to
// the nonce and user data (in Gatehouse the vTPM attestation key, see
// package cvm). It only works inside an SEV-SNP guest; elsewhere New fails.
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

// Interface names the guest interface reports come through.
type Interface string

// The guest interfaces.
const (
	// Auto uses configfs-tsm where the kernel has it (Linux 6.7+), else
	// /dev/sev-guest.
	Auto Interface = "auto"
	// configFSTSM is /sys/kernel/config/tsm/report.
	configFSTSM Interface = "configfs-tsm"
	// sevGuest is the /dev/sev-guest ioctl interface.
	sevGuest Interface = "sev-guest"
)

// ParseInterface parses "auto", "configfs-tsm" or "sev-guest".
func ParseInterface(s string) (Interface, error) {
	switch i := Interface(s); i {
	case Auto, configFSTSM, sevGuest:
		return i, nil
	}
	return "", fmt.Errorf("unknown SEV-SNP guest interface %q: use %s, %s or %s", s, Auto, configFSTSM, sevGuest)
}

// ReportAttester produces SEV-SNP reports as SNPEvidence.
type ReportAttester struct {
	provider client.QuoteProvider
}

// New opens the SEV-SNP guest interface iface, or fails outside an
// SEV-SNP guest, saying which interface it tried.
func New(iface Interface) (*ReportAttester, error) {
	var provider client.QuoteProvider
	switch iface {
	case Auto:
		p, err := client.GetQuoteProvider()
		if err != nil {
			return nil, fmt.Errorf("opening the SEV-SNP guest interface (configfs-tsm, then /dev/sev-guest): %w", err)
		}
		provider = p
	case configFSTSM:
		provider = &client.LinuxConfigFsQuoteProvider{}
	case sevGuest:
		provider = &client.LinuxIoctlQuoteProvider{}
	default:
		return nil, fmt.Errorf("unknown SEV-SNP guest interface %q", iface)
	}
	if !provider.IsSupported() {
		return nil, fmt.Errorf("SEV-SNP guest interface %s not available: not an SEV-SNP guest, or the kernel lacks it", iface)
	}
	return NewWithProvider(provider)
}

// NewWithProvider returns an attester using provider, e.g. go-sev-guest's
// test quote provider (package snptest).
func NewWithProvider(provider client.QuoteProvider) (*ReportAttester, error) {
	if provider == nil || !provider.IsSupported() {
		return nil, errors.New("SEV-SNP quote provider not available")
	}
	return &ReportAttester{provider: provider}, nil
}

// Variant returns attestation.VariantSNP.
func (a *ReportAttester) Variant() attestation.Variant { return attestation.VariantSNP }

// Attest requests a report with REPORT_DATA = SHA-512(nonce || userData) and
// returns it with the host's certificate table as marshalled SNPEvidence.
func (a *ReportAttester) Attest(_ context.Context, userData, nonce []byte) ([]byte, error) {
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
