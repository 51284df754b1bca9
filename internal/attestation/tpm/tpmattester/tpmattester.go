// Package tpmattester is the "tpm" attester, the node's half of the tpm
// variant (package tpm is the verifier's): it measures a boot into a TPM's
// PCRs (MeasureBoot) and produces evidence, a quote over them signed by an
// attestation key (docs/attestation.md). As with go-tpm-tools' client and
// server packages, nodes link this package, verifiers need only package tpm.
package tpmattester

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// Options configures an QuoteAttester.
type Options struct {
	// PCRs is the SHA-256 PCR selection to quote; it must equal the
	// verifier's policy.
	PCRs []int
	// EventLog, when set, is sent with every evidence (see MeasureBoot).
	EventLog []byte
	// TCGEventLogPath, when set, is the file of the TCG event log the
	// firmware and kernel wrote (tpm.DefaultTCGEventLogPath), read afresh
	// for every evidence and sent with it; Attest fails when it cannot be
	// read or exceeds tpm.MaxTCGEventLogSize.
	TCGEventLogPath string
	// AKCertificates, when set, is the AK's certificate chain, DER, leaf first.
	AKCertificates [][]byte
	// EKCertificate says whether evidence carries the certificate of the
	// TPM's RSA EK (from NV index 0x01c00002, where the manufacturer wrote
	// it), so a verifier trusting the manufacturer's CA trusts the AK once
	// the attester answered its credential activation challenge (Activate).
	// The zero value is EKCertificateOff.
	EKCertificate EKCertificateMode
	// AttestationKey chooses the AK; the zero value is AKOwner.
	AttestationKey AKSource
}

// AKSource names where the attester's AK comes from.
type AKSource string

// The AK sources.
const (
	// AKOwner is go-tpm-tools' ECC P-256 AK template in the owner
	// hierarchy: the same key on every boot of a TPM, to pin or to activate
	// against the EK.
	AKOwner AKSource = "owner"
	// AKGCE is a Compute Engine vTPM's ECC AK: created in the endorsement
	// hierarchy from the template Google wrote into NV index 0x01c10003,
	// with the certificate Google's vTPM CA issued the instance, from NV
	// index 0x01c10002, sent with every evidence (policy gce).
	AKGCE AKSource = "gce"
	// AKAzure is the RSA AK Azure provisions in a Trusted Launch or
	// confidential VM's vTPM at persistent handle 0x81000003, with the
	// certificate Azure's vTPM CA issued it from NV index 0x01c101d0 when
	// the vTPM holds one (Trusted Launch: policy azureTrustedLaunch; a
	// confidential VM's HCL report binds the key instead).
	AKAzure AKSource = "azure"
	// AKAWSNitro is AKOwner's key on an EC2 instance with NitroTPM: every
	// evidence also carries the attestation document the Nitro hypervisor
	// signs, naming this AK and the quote's binding (policy awsNitroTPM).
	AKAWSNitro AKSource = "aws-nitro"
)

// Azure's vTPM handles (docs/attestation.md, "Cloud vTPMs: Azure Trusted
// Launch" and "Azure confidential VMs").
const (
	AzureAKHandle        = tpmutil.Handle(0x81000003)
	AzureAKCertificateNV = tpmutil.Handle(0x01c101d0)
)

// EKCertificateMode says whether evidence carries the TPM's EK certificate.
type EKCertificateMode string

// The EK certificate modes.
const (
	// EKCertificateOff sends none: verifiers must pin the AK or trust an
	// AK certificate.
	EKCertificateOff EKCertificateMode = "off"
	// EKCertificateAuto sends it when the TPM holds one.
	EKCertificateAuto EKCertificateMode = "auto"
	// EKCertificateRequired sends it, and New fails when the TPM holds none.
	EKCertificateRequired EKCertificateMode = "required"
)

// ParseEKCertificateMode parses "off", "auto" or "required".
func ParseEKCertificateMode(s string) (EKCertificateMode, error) {
	switch m := EKCertificateMode(s); m {
	case EKCertificateOff, EKCertificateAuto, EKCertificateRequired:
		return m, nil
	}
	return "", fmt.Errorf("EK certificate mode %q: use off, auto or required", s)
}

// QuoteAttester produces "tpm" evidence with a TPM. It creates a transient ECC
// P-256 attestation key from the TPM's owner hierarchy with go-tpm-tools'
// AK template; on a given TPM that key is the same every time, so verifiers
// can pin it. It is safe for concurrent use: TPM commands are serialised,
// and a caller waiting for the TPM stops waiting when its context ends.
type QuoteAttester struct {
	// turn holds one token while a TPM command runs: a lock that a waiter
	// can leave when its context ends (sync.Mutex cannot), so a caller
	// whose deadline passed never waits behind a queue of quotes.
	turn   chan struct{}
	tpm    io.ReadWriter
	ak     *client.Key
	opts   Options
	pub    []byte // the AK's TPMT_PUBLIC
	ekCert []byte // the EK certificate sent with evidence, DER; nil when opts.EKCertificate sends none
}

// New creates the attestation key on the TPM at rw. Close flushes it.
func New(rw io.ReadWriter, opts Options) (*QuoteAttester, error) {
	if len(opts.PCRs) == 0 {
		return nil, errors.New("tpm attester: no PCRs selected")
	}
	var ak *client.Key
	var err error
	switch opts.AttestationKey {
	case "", AKOwner, AKAWSNitro:
		ak, err = client.NewKey(rw, tpm2.HandleOwner, client.AKTemplateECC())
	case AKGCE:
		ak, err = gceAK(rw)
		if err == nil {
			opts.AKCertificates = [][]byte{ak.CertDERBytes()}
		}
	case AKAzure:
		var cert []byte
		ak, cert, err = azureAK(rw)
		if err == nil && cert != nil {
			opts.AKCertificates = [][]byte{cert}
		}
	default:
		return nil, fmt.Errorf("tpm attester: unknown attestation key source %q: use owner, gce, azure or aws-nitro", opts.AttestationKey)
	}
	if err != nil {
		return nil, fmt.Errorf("creating attestation key: %w", err)
	}
	pub, err := ak.PublicArea().Encode()
	if err != nil {
		ak.Close()
		return nil, fmt.Errorf("encoding attestation key: %w", err)
	}
	var ekCert []byte
	switch opts.EKCertificate {
	case "", EKCertificateOff:
	case EKCertificateAuto, EKCertificateRequired:
		if ekCert, err = readEKCertificate(rw); err != nil && (opts.EKCertificate == EKCertificateRequired || !errors.Is(err, errNoEKCertificate)) {
			ak.Close()
			return nil, err
		}
	default:
		ak.Close()
		return nil, fmt.Errorf("tpm attester: unknown EK certificate mode %q", opts.EKCertificate)
	}
	opts.PCRs = slices.Clone(opts.PCRs)
	return &QuoteAttester{turn: make(chan struct{}, 1), tpm: rw, ak: ak, opts: opts, pub: pub, ekCert: ekCert}, nil
}

// gceAK loads a Compute Engine vTPM's ECC AK with its certificate.
func gceAK(rw io.ReadWriter) (*client.Key, error) {
	ak, err := client.GceAttestationKeyECC(rw)
	if err != nil {
		return nil, fmt.Errorf("loading the Compute Engine AK from its template in NV index %#x (is this a Shielded or Confidential VM?): %w",
			client.GceAKTemplateNVIndexECC, err)
	}
	if ak.CertDERBytes() == nil {
		ak.Close()
		return nil, fmt.Errorf("the vTPM holds no AK certificate in NV index %#x: Compute Engine issues one to Shielded VMs", client.GceAKCertNVIndexECC)
	}
	return ak, nil
}

// azureAK loads an Azure vTPM's AK from its persistent handle, with its
// certificate (DER; nil when the vTPM holds none, as on a confidential VM
// whose HCL report binds the key).
func azureAK(rw io.ReadWriter) (*client.Key, []byte, error) {
	ak, err := client.LoadCachedKey(rw, AzureAKHandle, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the Azure AK from persistent handle %#x (is this an Azure Trusted Launch or confidential VM?): %w", AzureAKHandle, err)
	}
	if _, err := tpm2.NVReadPublic(rw, AzureAKCertificateNV); err != nil {
		return ak, nil, nil
	}
	cert, err := tpm2.NVReadEx(rw, AzureAKCertificateNV, tpm2.HandleOwner, "", 0)
	if err != nil {
		ak.Close()
		return nil, nil, fmt.Errorf("reading the Azure AK certificate from NV index %#x: %w", AzureAKCertificateNV, err)
	}
	// The index may be larger than the certificate: keep the DER only.
	rest, err := asn1.Unmarshal(cert, new(asn1.RawValue))
	if err != nil {
		ak.Close()
		return nil, nil, fmt.Errorf("the Azure AK certificate in NV index %#x is not DER: %w", AzureAKCertificateNV, err)
	}
	return ak, cert[:len(cert)-len(rest)], nil
}

// readEKCertificate returns the RSA EK's certificate from the TPM's NV
// index 0x01c00002, checked to certify that EK.
func readEKCertificate(rw io.ReadWriter) ([]byte, error) {
	ek, err := client.EndorsementKeyRSA(rw)
	if err != nil {
		return nil, fmt.Errorf("reading the EK certificate: %w", err)
	}
	defer ek.Close()
	der := ek.CertDERBytes()
	if der == nil {
		return nil, fmt.Errorf("%w in NV index %#x: its manufacturer did not provision one; "+
			"pin its attestation key in the policy instead", errNoEKCertificate, client.EKCertNVIndexRSA)
	}
	return der, nil
}

var errNoEKCertificate = errors.New("this TPM has no RSA EK certificate")

// Variant returns attestation.VariantTPM.
func (a *QuoteAttester) Variant() attestation.Variant { return attestation.VariantTPM }

// AttestationKey returns the AK's public key, to pin in a verifier's policy.
func (a *QuoteAttester) AttestationKey() crypto.PublicKey { return a.ak.PublicKey() }

// Identity returns the identity verifiers see for this attester's evidence
// (see tpm.Identity).
func (a *QuoteAttester) Identity() (string, error) { return tpm.Identity(a.ak.PublicKey()) }

// lock waits for the TPM until ctx ends; on success the caller must call
// unlock. A command already sent to the TPM is not interrupted: only the
// wait ends. The error wraps ctx's cause (context.DeadlineExceeded,
// context.Canceled).
func (a *QuoteAttester) lock(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("waiting for the TPM: %w", err)
	}
	select {
	case a.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the TPM: %w", context.Cause(ctx))
	}
}

func (a *QuoteAttester) unlock() { <-a.turn }

// WithTPM runs f with the TPM while no other command of this attester
// runs, waiting for the TPM at most until ctx ends (then failing wrapping
// ctx's cause): for a caller's own commands that must not interleave with
// quotes, such as an Azure HCL report's NV write and read.
func (a *QuoteAttester) WithTPM(ctx context.Context, f func(rw io.ReadWriter) error) error {
	if err := a.lock(ctx); err != nil {
		return err
	}
	defer a.unlock()
	return f(a.tpm)
}

// Attest quotes the selected PCRs with extraData SHA-256(nonce || userData)
// and returns marshalled TPMEvidence. It waits for the TPM (another
// caller's command) at most until ctx ends, then fails wrapping ctx's cause.
func (a *QuoteAttester) Attest(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	tcgLog, err := a.tcgEventLog()
	if err != nil {
		return nil, err
	}
	if err := a.lock(ctx); err != nil {
		return nil, err
	}
	binding := attestation.Binding256(nonce, userData)
	q, err := a.ak.Quote(tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: a.opts.PCRs}, binding)
	var document []byte
	if err == nil && a.opts.AttestationKey == AKAWSNitro {
		document, err = nitroDocument(a.tpm, a.ak.PublicKey().(*ecdsa.PublicKey), binding)
	}
	a.unlock()
	if err != nil {
		return nil, fmt.Errorf("quoting PCRs %v: %w", a.opts.PCRs, err)
	}
	ev := &attestationv1.TPMEvidence{
		Quote:                      q.GetQuote(),
		Signature:                  q.GetRawSig(),
		PcrHashAlgorithm:           uint32(q.GetPcrs().GetHash()),
		Pcrs:                       q.GetPcrs().GetPcrs(),
		AttestationKey:             a.pub,
		AttestationKeyCertificates: a.opts.AKCertificates,
		EventLog:                   a.opts.EventLog,
		UserData:                   userData,
		EndorsementKeyCertificate:  a.ekCert,
		TcgEventLog:                tcgLog,
		NitroDocument:              document,
	}
	out, err := proto.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encoding TPM evidence: %w", err)
	}
	return out, nil
}

// tcgEventLog reads the TCG event log from Options.TCGEventLogPath; nil
// when none is set. It is read before the quote: a log that grew in
// between would not replay (a firmware's log no longer changes once the
// kernel runs).
func (a *QuoteAttester) tcgEventLog() ([]byte, error) {
	path := a.opts.TCGEventLogPath
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the TCG event log: %w", err)
	}
	defer f.Close()
	// securityfs reports no size: read up to one byte past the limit.
	log, err := io.ReadAll(io.LimitReader(f, tpm.MaxTCGEventLogSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading the TCG event log %s: %w", path, err)
	}
	if len(log) > tpm.MaxTCGEventLogSize {
		return nil, fmt.Errorf("the TCG event log %s has more than %d bytes, more than evidence can carry: "+
			"start the bootstrapper with --tcg-event-log \"\" to send none", path, tpm.MaxTCGEventLogSize)
	}
	return log, nil
}

// Close flushes the attestation key from the TPM, after any command in
// progress. It does not close the TPM.
func (a *QuoteAttester) Close() error {
	if err := a.lock(context.Background()); err != nil {
		return err
	}
	defer a.unlock()
	a.ak.Close()
	return nil
}

// EKCertificate returns the EK certificate evidence carries, DER; nil when
// it carries none (Options.EKCertificate).
func (a *QuoteAttester) EKCertificate() []byte { return a.ekCert }

// RequestsActivation reports whether evidence carries the EK certificate
// (Options.EKCertificate), which asks the verifier for a credential
// activation challenge (attestation.Activator).
func (a *QuoteAttester) RequestsActivation() bool { return a.ekCert != nil }

// Activate answers a marshalled TPMActivationChallenge (the verifier's
// attestation.KeyActivation) with ActivateCredential, waiting for the TPM
// at most until ctx ends, as Attest does.
func (a *QuoteAttester) Activate(ctx context.Context, challenge []byte) ([]byte, error) {
	c, err := tpm.ParseActivationChallenge(challenge)
	if err != nil {
		return nil, err
	}
	return a.activateCredential(ctx, c.Credential, c.EncryptedSecret)
}

// ActivateCredential answers a credential activation challenge
// (tpm.NewActivationChallenge) made for this attester's AK under the TPM's
// RSA EK (the TCG default template, client.EndorsementKeyRSA):
// TPM2_ActivateCredential, with the EK's policy satisfied by
// PolicySecret(TPM_RH_ENDORSEMENT). It returns the challenge's secret; a
// TPM that does not hold both keys cannot recover it, and the TPM refuses.
// credential and encryptedSecret are the challenge's TPM2B encodings. It
// waits for the TPM as long as another command takes; Activate is the
// variant whose wait ends with its context.
func (a *QuoteAttester) ActivateCredential(credential, encryptedSecret []byte) ([]byte, error) {
	return a.activateCredential(context.Background(), credential, encryptedSecret)
}

func (a *QuoteAttester) activateCredential(ctx context.Context, credential, encryptedSecret []byte) ([]byte, error) {
	if len(credential) < 2 || len(encryptedSecret) < 2 {
		return nil, errors.New("activating the credential: challenge too short")
	}
	if err := a.lock(ctx); err != nil {
		return nil, err
	}
	defer a.unlock()
	ek, err := client.EndorsementKeyRSA(a.tpm)
	if err != nil {
		return nil, fmt.Errorf("loading the endorsement key: %w", err)
	}
	defer ek.Close()
	session, _, err := tpm2.StartAuthSession(a.tpm, tpm2.HandleNull, tpm2.HandleNull, make([]byte, 16), nil,
		tpm2.SessionPolicy, tpm2.AlgNull, tpm2.AlgSHA256)
	if err != nil {
		return nil, fmt.Errorf("starting the EK policy session: %w", err)
	}
	defer func() { _ = tpm2.FlushContext(a.tpm, session) }()
	password := tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession}
	if _, _, err := tpm2.PolicySecret(a.tpm, tpm2.HandleEndorsement, password, session, nil, nil, nil, 0); err != nil {
		return nil, fmt.Errorf("satisfying the EK policy: %w", err)
	}
	secret, err := tpm2.ActivateCredentialUsingAuth(a.tpm, []tpm2.AuthCommand{
		password, // the AK: no password
		{Session: session, Attributes: tpm2.AttrContinueSession}, // the EK: its policy
	}, a.ak.Handle(), ek.Handle(), credential[2:], encryptedSecret[2:])
	if err != nil {
		return nil, fmt.Errorf("activating the credential: %w", err)
	}
	return secret, nil
}
