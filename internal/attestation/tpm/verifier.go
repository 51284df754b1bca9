// Package tpm is the "tpm" attestation variant: evidence is a TPM 2.0 quote
// over a SHA-256 PCR selection whose extraData binds the relying party's nonce
// and the attester's user data, signed by an attestation key (AK) that the
// verifier trusts either by pinning its public key or through an AK
// certificate chain.
//
// Structures follow the TPM 2.0 Library specification, Part 2: Structures
// (TPMS_ATTEST §10.12.12, TPMS_QUOTE_INFO §10.12.4, TPMT_SIGNATURE §11.3.4,
// TPMT_PUBLIC §12.2.4).
package tpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// tpmGeneratedValue is TPM_GENERATED_VALUE, the magic a TPM puts first in
// every structure it signs (Part 2 §6.2); restricted signing keys refuse to
// sign data starting with it, so a quote bearing it was made by the TPM.
const tpmGeneratedValue = 0xff544347

// requiredAKAttributes are the TPMA_OBJECT bits an attestation key must have:
// a signing key restricted to TPM-generated data, created inside the TPM and
// never leaving it (Part 2 §8.3).
const requiredAKAttributes = tpm2.FlagSign | tpm2.FlagRestricted | tpm2.FlagFixedTPM |
	tpm2.FlagFixedParent | tpm2.FlagSensitiveDataOrigin

// Endorsement says which attestation keys the verifier trusts. Set exactly
// one of PinnedKeys, Roots, EKRoots, GCE and Azure.
type Endorsement struct {
	// PinnedKeys are trusted AK public keys.
	PinnedKeys []crypto.PublicKey
	// Roots verify an AK certificate chain sent with the evidence; the leaf's
	// public key must be the AK. Intermediates may come with the evidence.
	Roots *x509.CertPool
	// EKRoots are TPM manufacturers' CAs: the evidence's EK certificate
	// must chain to one of them (through EKIntermediates), and the AK is
	// trusted once the attester answered a credential activation challenge
	// made for the AK under that EK (docs/attestation.md, "Endorsed keys").
	EKRoots *x509.CertPool
	// EKIntermediates are the manufacturers' issuing CAs, which EK
	// certificates name but TPMs do not store; nil when none.
	EKIntermediates *x509.CertPool
	// GCE trusts Compute Engine vTPMs by the AK certificate Google's vTPM
	// CA issued the instance, in allowed projects and zones.
	GCE *GCEEndorsement
	// Azure trusts Azure Trusted Launch vTPMs by the AK certificate
	// Azure provisions in the vTPM, chaining to Microsoft's vTPM root.
	Azure *AzureEndorsement
	// Nitro trusts AWS NitroTPM vTPMs by the attestation document the
	// Nitro hypervisor signs, naming the AK, the quote's binding and the
	// instance's SHA-384 PCRs.
	Nitro *NitroEndorsement
}

// mode names the one trust anchor e sets, or "" when it sets none or more
// than one.
func (e Endorsement) mode() string {
	var modes []string
	if len(e.PinnedKeys) > 0 {
		modes = append(modes, "pinned")
	}
	if e.Roots != nil {
		modes = append(modes, "ak-certificate")
	}
	if e.EKRoots != nil {
		modes = append(modes, "ek-certificate")
	}
	if e.GCE != nil {
		modes = append(modes, "gce")
	}
	if e.Azure != nil {
		modes = append(modes, "azure")
	}
	if e.Nitro != nil {
		modes = append(modes, "nitro")
	}
	if len(modes) != 1 {
		return ""
	}
	return modes[0]
}

// QuotePolicy is the appraisal policy of a QuoteVerifier.
type QuotePolicy struct {
	// PCRs is the exact SHA-256 PCR selection a quote must cover.
	PCRs []int
	// ReferenceValues are compared with the quoted PCR values.
	ReferenceValues measurements.M
	// Endorsement says which AKs are trusted.
	Endorsement Endorsement
	// RequireEventLog refuses evidence without a TCG event log
	// (TPMEvidence.tcg_event_log), so every refusal of a PCR can name its
	// events (docs/attestation.md, "Event logs").
	RequireEventLog bool
}

// QuoteVerifier verifies "tpm" evidence. It is safe for concurrent use.
type QuoteVerifier struct {
	policy QuotePolicy
	mode   string // policy.Endorsement.mode(), fixed at construction
	now    func() time.Time
	// pinned holds the Identity of each of policy.Endorsement.PinnedKeys,
	// so finding a pinned key costs the same with one key or thousands.
	pinned map[string]bool
	// replays remembers the TCG event logs replayed last.
	replays *replayCache
	// aks remembers the attestation keys decoded.
	aks *akMemo
}

// NewQuoteVerifier returns a verifier for policy. now gives the time AK
// certificates are checked at (time.Now in production).
func NewQuoteVerifier(policy QuotePolicy, now func() time.Time) (*QuoteVerifier, error) {
	if len(policy.PCRs) == 0 {
		return nil, errors.New("tpm policy: no PCRs selected")
	}
	for _, pcr := range policy.PCRs {
		if pcr < 0 || pcr > 23 {
			return nil, fmt.Errorf("tpm policy: PCR %d out of range 0-23", pcr)
		}
	}
	mode := policy.Endorsement.mode()
	if mode == "" {
		return nil, errors.New("tpm policy: set exactly one of pinned attestation keys, AK certificate roots, EK certificate roots, GCE, Azure and AWS NitroTPM")
	}
	return newVerifier(policy, mode, now)
}

// NewBoundVerifier returns a verifier for quotes from a confidential VM's
// vTPM, whose AK no TPM endorsement vouches for: a hardware report (SEV-SNP,
// TDX) binds it instead, and the caller passes the AK that report binds to
// VerifyBound (package cvm). policy.Endorsement must be empty. Verify
// always fails on such a verifier, so it cannot admit an unendorsed key.
func NewBoundVerifier(policy QuotePolicy, now func() time.Time) (*QuoteVerifier, error) {
	if e := policy.Endorsement; len(e.PinnedKeys) > 0 || e.Roots != nil || e.EKRoots != nil || e.EKIntermediates != nil || e.GCE != nil || e.Azure != nil || e.Nitro != nil {
		return nil, errors.New("tpm policy: a vTPM whose key a hardware report binds takes no other key endorsement")
	}
	return newVerifier(policy, modeBound, now)
}

// modeBound is the key trust of NewBoundVerifier's verifiers.
const modeBound = "bound"

func newVerifier(policy QuotePolicy, mode string, now func() time.Time) (*QuoteVerifier, error) {
	if g := policy.Endorsement.GCE; g != nil {
		if len(g.Projects) == 0 {
			return nil, errors.New("tpm policy: GCE needs at least one allowed project, or every Compute Engine VM of every Google customer would be trusted")
		}
		if g.Roots == nil {
			roots, intermediates, err := googleRoots()
			if err != nil {
				return nil, err
			}
			gce := *g
			gce.Roots, gce.Intermediates = roots, intermediates
			policy.Endorsement.GCE = &gce
		}
	}
	if a := policy.Endorsement.Azure; a != nil {
		if err := a.check(); err != nil {
			return nil, err
		}
		azure, err := a.withEmbeddedCAs()
		if err != nil {
			return nil, err
		}
		policy.Endorsement.Azure = azure
	}
	if n := policy.Endorsement.Nitro; n != nil {
		if err := n.check(); err != nil {
			return nil, err
		}
		nitro, err := n.withEmbeddedRoot()
		if err != nil {
			return nil, err
		}
		policy.Endorsement.Nitro = nitro
	}
	for index := range policy.ReferenceValues {
		if !slices.Contains(policy.PCRs, int(index)) {
			return nil, fmt.Errorf("tpm policy: reference value for PCR %d, which the PCR selection does not include", index)
		}
	}
	p := policy
	p.PCRs = slices.Clone(policy.PCRs)
	slices.Sort(p.PCRs)
	p.PCRs = slices.Compact(p.PCRs)
	v := &QuoteVerifier{policy: p, mode: mode, now: now, pinned: map[string]bool{}, replays: newReplayCache(), aks: &akMemo{}}
	for i, key := range policy.Endorsement.PinnedKeys {
		identity, err := Identity(key)
		if err != nil {
			return nil, fmt.Errorf("tpm policy: pinned attestation key %d: %w", i, err)
		}
		v.pinned[identity] = true
	}
	return v, nil
}

// Variant returns attestation.VariantTPM.
func (v *QuoteVerifier) Variant() attestation.Variant { return attestation.VariantTPM }

// Verify checks evidence (a marshalled TPMEvidence) and returns what it
// proves. The checks, each failing with an error wrapping an
// attestation.Err* value:
//
//   - the evidence parses and is at most attestation.MaxEvidenceSize bytes;
//   - the AK is a restricted, fixedTPM signing key, and is pinned,
//     certified by a chain to the configured roots (or, gce and azure, to
//     the cloud's vTPM CAs, the certificate naming an admitted VM), or (EK
//     roots) sent with
//     an EK certificate chaining to a manufacturer's root, then the
//     result's Activation must be answered;
//   - the signature uses SHA-256 or stronger and verifies under the AK;
//   - the quote starts with TPM_GENERATED_VALUE and is of type TPM_ST_ATTEST_QUOTE;
//   - extraData equals SHA-256(nonce || user data);
//   - the quoted selection is exactly the policy's, in the SHA-256 bank;
//   - the reported PCR values hash to the quoted PCR digest;
//   - the event log, when present, replays to the reported PCR values;
//   - the TCG event log, when present (required by RequireEventLog),
//     replays to them: go-eventlog parses it (at most MaxTCGEventLogSize
//     bytes) and replays its SHA-256 digests; the result's BootEvents are
//     its events;
//   - the PCR values match the reference values; a refusal names, from the
//     TCG event log, the event behind each differing PCR that differs from
//     the reference value's expected events (ExplainMismatches).
func (v *QuoteVerifier) Verify(_ context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	if v.mode == modeBound {
		return nil, fmt.Errorf("%w: this verifier trusts only an attestation key a hardware report binds (VerifyBound)", attestation.ErrUntrustedKey)
	}
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	ev, err := ParseEvidence(evidence)
	if err != nil {
		return nil, err
	}
	return v.verify(ev, attestation.Binding256(nonce, ev.GetUserData()), boundKey{})
}

// VerifyBound runs Verify's checks on a verifier from NewBoundVerifier,
// trusting the attestation key only if its TPMT_PUBLIC equals boundAK, the
// key a verified hardware report binds (package cvm); the result's
// Endorsement is then "bound". Errors as Verify's; on any other verifier
// it fails.
func (v *QuoteVerifier) VerifyBound(_ context.Context, evidence, nonce, boundAK []byte) (*attestation.Result, error) {
	if v.mode != modeBound || len(boundAK) == 0 {
		return nil, fmt.Errorf("%w: VerifyBound needs a verifier from NewBoundVerifier and a bound key", attestation.ErrUntrustedKey)
	}
	if err := attestation.CheckNonce(nonce); err != nil {
		return nil, err
	}
	ev, err := ParseEvidence(evidence)
	if err != nil {
		return nil, err
	}
	return v.verify(ev, attestation.Binding256(nonce, ev.GetUserData()), boundKey{tpmtPublic: boundAK})
}

// VerifyBoundKey runs Verify's checks on a verifier from NewBoundVerifier,
// with the quote's extraData equal to extraData, trusting the attestation
// key only if its public key equals key: the form of a vTPM whose
// hardware report carries the AK as a public key rather than its
// TPMT_PUBLIC (Azure's HCL report, a JSON Web Key: package azurecvm).
// Errors as Verify's; on any other verifier it fails.
func (v *QuoteVerifier) VerifyBoundKey(_ context.Context, evidence, extraData []byte, key crypto.PublicKey) (*attestation.Result, error) {
	if v.mode != modeBound || key == nil {
		return nil, fmt.Errorf("%w: VerifyBoundKey needs a verifier from NewBoundVerifier and a bound key", attestation.ErrUntrustedKey)
	}
	ev, err := ParseEvidence(evidence)
	if err != nil {
		return nil, err
	}
	return v.verify(ev, extraData, boundKey{key: key})
}

// boundKey is the AK a hardware report binds, for a verifier in modeBound:
// its TPMT_PUBLIC, or (when that is nil) its public key.
type boundKey struct {
	tpmtPublic []byte
	key        crypto.PublicKey
}

// VerifyExtraData runs Verify's checks on evidence whose quote's extraData
// must equal extraData itself, rather than SHA-256(nonce || user data): the
// form of quotes other attesters record (go-tpm-tools' client.Attest puts
// the relying party's nonce there). It lets recorded real evidence, such
// as a Compute Engine vTPM's, run through the same checks; Gatehouse's
// relying parties use Verify.
func (v *QuoteVerifier) VerifyExtraData(_ context.Context, evidence, extraData []byte) (*attestation.Result, error) {
	ev, err := ParseEvidence(evidence)
	if err != nil {
		return nil, err
	}
	if v.mode == modeBound {
		return nil, fmt.Errorf("%w: this verifier trusts only an attestation key a hardware report binds (VerifyBound)", attestation.ErrUntrustedKey)
	}
	return v.verify(ev, extraData, boundKey{})
}

// verify checks parsed evidence whose quote must carry extraData; bound
// is the AK a hardware report binds, for a verifier in modeBound.
func (v *QuoteVerifier) verify(ev *attestationv1.TPMEvidence, extraData []byte, bound boundKey) (*attestation.Result, error) {
	ak, err := v.trustedAK(ev, bound, extraData)
	if err != nil {
		return nil, err
	}
	ek, err := v.endorsement(ev)
	if err != nil {
		return nil, err
	}
	endorsement := ek.desc
	if ak.endorsement != "" {
		endorsement = ak.endorsement
	}
	sigHash, err := verifySignature(ev.GetQuote(), ev.GetSignature(), ak.key)
	if err != nil {
		return nil, err
	}
	quote, err := decodeQuote(ev.GetQuote())
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare(quote.ExtraData, extraData) != 1 {
		return nil, fmt.Errorf("%w: quote extraData is not SHA-256(nonce || user data)", attestation.ErrNonce)
	}
	pcrs, err := v.checkPCRs(ev, quote, sigHash)
	if err != nil {
		return nil, err
	}
	if len(ev.GetEventLog()) > 0 {
		if err := replayEventLog(ev.GetEventLog(), pcrs); err != nil {
			return nil, err
		}
	}
	events, err := v.bootEvents(ev.GetTcgEventLog(), pcrs)
	if err != nil {
		return nil, err
	}
	warnings, err := v.policy.ReferenceValues.Compare(pcrs)
	if err != nil {
		return nil, fmt.Errorf("%w: %w%s", attestation.ErrMeasurement, err, ExplanationSuffix(ExplainMismatches(v.policy.ReferenceValues, pcrs, events)))
	}
	result := &attestation.Result{
		Variant:       attestation.VariantTPM,
		UserData:      ev.GetUserData(),
		Identity:      ak.identity,
		EKCertificate: ek.name,
		GCEInstance:   ak.gce,
		Measurements:  pcrs,
		BootEvents:    events,
		Endorsement:   endorsement,
		Activation:    ek.activation,
		Hardware:      ak.hardware,
	}
	for _, w := range warnings {
		result.Warnings = append(result.Warnings, "PCR "+w.String())
	}
	return result, nil
}

// Identity returns the attestation identity of an AK public key:
// "tpm-ak:sha256:" and the hex SHA-256 of its DER SubjectPublicKeyInfo
// (attestation.Result.Identity). The attester and the verifier compute it
// alike, so a node knows the identity its keys are bound to.
func Identity(ak crypto.PublicKey) (string, error) {
	spki, err := x509.MarshalPKIXPublicKey(ak)
	if err != nil {
		return "", fmt.Errorf("encoding attestation key: %w", err)
	}
	sum := sha256.Sum256(spki)
	return attestation.PrefixAK + hex.EncodeToString(sum[:]), nil
}

// ParseEvidence decodes marshalled TPMEvidence, refusing more than
// attestation.MaxEvidenceSize bytes. The TCG event log, most of the
// evidence's bytes, is not copied: TcgEventLog is a slice of evidence,
// which must not change while the result is in use.
func ParseEvidence(evidence []byte) (*attestationv1.TPMEvidence, error) {
	if len(evidence) > attestation.MaxEvidenceSize {
		return nil, fmt.Errorf("%w: %d bytes, at most %d allowed", attestation.ErrMalformed, len(evidence), attestation.MaxEvidenceSize)
	}
	rest, tcgLog, err := splitTCGEventLog(evidence)
	if err != nil {
		return nil, err
	}
	ev := &attestationv1.TPMEvidence{}
	if err := attestation.DecodeEvidence(rest, ev); err != nil {
		return nil, err
	}
	ev.TcgEventLog = tcgLog
	if len(ev.GetQuote()) == 0 || len(ev.GetSignature()) == 0 || len(ev.GetAttestationKey()) == 0 {
		return nil, fmt.Errorf("%w: TPM evidence lacks a quote, signature or attestation key", attestation.ErrMalformed)
	}
	return ev, nil
}

// trustedKey is an AK that trustedAK accepted.
type trustedKey struct {
	key      crypto.PublicKey
	identity string
	// endorsement describes the AK's trust when the AK's own certificate
	// says more than the mode (gce, azure); "" otherwise.
	endorsement string
	// gce is the instance a gce AK certificate names.
	gce *attestation.GCEInstance
	// hardware is what a NitroTPM document vouches for (its SHA-384
	// PCRs); nil elsewhere.
	hardware *attestation.Result
}

// trustedAK decodes the AK, checks its attributes and its endorsement, and
// returns its public key and identity.
func (v *QuoteVerifier) trustedAK(ev *attestationv1.TPMEvidence, bound boundKey, extraData []byte) (trustedKey, error) {
	decoded, err := v.aks.decode(ev.GetAttestationKey())
	if err != nil {
		return trustedKey{}, err
	}
	key, identity := decoded.key, decoded.identity
	ak := trustedKey{key: key, identity: identity}

	switch v.mode {
	case modeBound:
		same := subtle.ConstantTimeCompare(ev.GetAttestationKey(), bound.tpmtPublic) == 1
		if bound.tpmtPublic == nil {
			k, ok := key.(interface{ Equal(crypto.PublicKey) bool })
			same = ok && bound.key != nil && k.Equal(bound.key)
		}
		if !same {
			return trustedKey{}, fmt.Errorf("%w: attestation key %s is not the key the hardware report binds", attestation.ErrUntrustedKey, identity)
		}
		return ak, nil
	case "ek-certificate":
		// Trusted through the EK: see endorsement.
		return ak, nil
	case "gce":
		ak.endorsement, ak.gce, err = v.policy.Endorsement.GCE.verify(ev.GetAttestationKeyCertificates(), key, v)
		if err != nil {
			return trustedKey{}, err
		}
		return ak, nil
	case "azure":
		ak.endorsement, err = v.policy.Endorsement.Azure.verify(ev.GetAttestationKeyCertificates(), key, v)
		if err != nil {
			return trustedKey{}, err
		}
		return ak, nil
	case "nitro":
		if ak.hardware, err = v.policy.Endorsement.Nitro.verify(ev.GetNitroDocument(), key, extraData, v); err != nil {
			return trustedKey{}, err
		}
		ak.endorsement = ak.hardware.Endorsement
		return ak, nil
	case "pinned":
		// The identity is the SHA-256 of the key's SubjectPublicKeyInfo:
		// equal identities are equal keys.
		if v.pinned[identity] {
			return ak, nil
		}
		return trustedKey{}, fmt.Errorf("%w: attestation key %s is not pinned", attestation.ErrUntrustedKey, identity)
	}
	if err := v.verifyAKCertificate(ev.GetAttestationKeyCertificates(), key); err != nil {
		return trustedKey{}, err
	}
	return ak, nil
}

func (v *QuoteVerifier) verifyAKCertificate(chain [][]byte, key crypto.PublicKey) error {
	_, err := v.verifyChain(chain, key, v.policy.Endorsement.Roots, nil)
	return err
}

// verifyChain checks an AK certificate chain (DER, leaf first) sent with
// the evidence: the leaf certifies key and chains, at v's time, to roots
// through the chain's other certificates and intermediates (may be nil).
// It returns the leaf.
func (v *QuoteVerifier) verifyChain(chain [][]byte, key crypto.PublicKey, roots, intermediates *x509.CertPool) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, fmt.Errorf("%w: no AK certificate, and the policy trusts only certified AKs", attestation.ErrUntrustedKey)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, fmt.Errorf("%w: parsing AK certificate: %w", attestation.ErrMalformed, err)
	}
	pool := x509.NewCertPool()
	if intermediates != nil {
		pool = intermediates.Clone()
	}
	for i, der := range chain[1:] {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%w: parsing AK intermediate certificate %d: %w", attestation.ErrMalformed, i+1, err)
		}
		pool.AddCert(cert)
	}
	if eq, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !eq.Equal(key) {
		return nil, fmt.Errorf("%w: AK certificate is for another key", attestation.ErrUntrustedKey)
	}
	if err := handleTPMSubjectAltName(leaf); err != nil {
		return nil, err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: pool,
		CurrentTime:   v.now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, fmt.Errorf("%w: AK certificate: %w", attestation.ErrUntrustedKey, err)
	}
	return leaf, nil
}

// verifySignature checks the TPMT_SIGNATURE over quote under key and returns
// the signature's hash, which also hashes the PCR digest.
func verifySignature(quote, rawSig []byte, key crypto.PublicKey) (crypto.Hash, error) {
	sig, err := tpm2.DecodeSignature(bytes.NewBuffer(rawSig))
	if err != nil {
		return 0, fmt.Errorf("%w: decoding signature: %w", attestation.ErrMalformed, err)
	}
	var hashAlg tpm2.Algorithm
	switch {
	case sig.ECC != nil:
		hashAlg = sig.ECC.HashAlg
	case sig.RSA != nil:
		hashAlg = sig.RSA.HashAlg
	default:
		return 0, fmt.Errorf("%w: signature algorithm %v", attestation.ErrMalformed, sig.Alg)
	}
	switch hashAlg {
	case tpm2.AlgSHA256, tpm2.AlgSHA384, tpm2.AlgSHA512:
	case tpm2.AlgSHA1:
		return 0, fmt.Errorf("%w: signature uses SHA-1", attestation.ErrPolicy)
	default:
		return 0, fmt.Errorf("%w: signature hash algorithm %v", attestation.ErrPolicy, hashAlg)
	}
	hash, err := hashAlg.Hash()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", attestation.ErrMalformed, err)
	}
	h := hash.New()
	h.Write(quote)
	digest := h.Sum(nil)
	switch pub := key.(type) {
	case *ecdsa.PublicKey:
		if sig.Alg != tpm2.AlgECDSA || sig.ECC == nil || !ecdsa.Verify(pub, digest, sig.ECC.R, sig.ECC.S) {
			return 0, fmt.Errorf("%w: ECDSA signature does not verify under the attestation key", attestation.ErrSignature)
		}
	case *rsa.PublicKey:
		if sig.Alg != tpm2.AlgRSASSA || sig.RSA == nil || rsa.VerifyPKCS1v15(pub, hash, digest, sig.RSA.Signature) != nil {
			return 0, fmt.Errorf("%w: RSASSA signature does not verify under the attestation key", attestation.ErrSignature)
		}
	default:
		return 0, fmt.Errorf("%w: attestation key type %T", attestation.ErrUntrustedKey, key)
	}
	return hash, nil
}

// decodeQuote checks the magic and type of a TPMS_ATTEST and decodes it.
func decodeQuote(quote []byte) (*tpm2.AttestationData, error) {
	if len(quote) < 6 {
		return nil, fmt.Errorf("%w: quote has %d bytes", attestation.ErrMalformed, len(quote))
	}
	if magic := binary.BigEndian.Uint32(quote); magic != tpmGeneratedValue {
		return nil, fmt.Errorf("%w: quote magic is %#x, not TPM_GENERATED_VALUE", attestation.ErrPolicy, magic)
	}
	if typ := binary.BigEndian.Uint16(quote[4:]); typ != uint16(tpm2.TagAttestQuote) {
		return nil, fmt.Errorf("%w: attestation type is %#x, not TPM_ST_ATTEST_QUOTE", attestation.ErrPolicy, typ)
	}
	att, err := tpm2.DecodeAttestationData(quote)
	if err != nil {
		return nil, fmt.Errorf("%w: decoding quote: %w", attestation.ErrMalformed, err)
	}
	if att.AttestedQuoteInfo == nil {
		return nil, fmt.Errorf("%w: quote has no quote info", attestation.ErrMalformed)
	}
	return att, nil
}

// checkPCRs checks the quoted selection against the policy and the reported
// values against the quoted digest, and returns the values.
func (v *QuoteVerifier) checkPCRs(ev *attestationv1.TPMEvidence, quote *tpm2.AttestationData, sigHash crypto.Hash) (map[uint32][]byte, error) {
	sel := quote.AttestedQuoteInfo.PCRSelection
	var size int
	switch sel.Hash {
	case tpm2.AlgSHA1:
		return nil, fmt.Errorf("%w: quote covers the SHA-1 PCR bank; only SHA-256 and SHA-384 are accepted", attestation.ErrPolicy)
	case tpm2.AlgSHA256:
		size = sha256.Size
	case tpm2.AlgSHA384:
		// A NitroTPM's signed bank; reference values of another size
		// never match it.
		size = sha512.Size384
	default:
		return nil, fmt.Errorf("%w: quote covers PCR bank %v; only SHA-256 and SHA-384 are accepted", attestation.ErrPolicy, sel.Hash)
	}
	quoted := slices.Sorted(slices.Values(sel.PCRs))
	if !slices.Equal(quoted, v.policy.PCRs) {
		return nil, fmt.Errorf("%w: quote covers PCRs %v, policy requires exactly %v", attestation.ErrPolicy, quoted, v.policy.PCRs)
	}
	if ev.GetPcrHashAlgorithm() != uint32(sel.Hash) {
		return nil, fmt.Errorf("%w: reported PCR bank %#x is not the quoted bank %#x", attestation.ErrPolicy, ev.GetPcrHashAlgorithm(), uint32(sel.Hash))
	}
	if len(ev.GetPcrs()) != len(quoted) {
		return nil, fmt.Errorf("%w: %d PCR values reported for %d quoted PCRs", attestation.ErrMalformed, len(ev.GetPcrs()), len(quoted))
	}
	h := sigHash.New()
	pcrs := make(map[uint32][]byte, len(quoted))
	for _, index := range quoted {
		value, ok := ev.GetPcrs()[uint32(index)]
		if !ok || len(value) != size {
			return nil, fmt.Errorf("%w: PCR %d value missing or not %d bytes", attestation.ErrMalformed, index, size)
		}
		h.Write(value)
		pcrs[uint32(index)] = value
	}
	if subtle.ConstantTimeCompare(h.Sum(nil), quote.AttestedQuoteInfo.PCRDigest) != 1 {
		return nil, fmt.Errorf("%w: reported PCR values do not hash to the quoted PCR digest", attestation.ErrSignature)
	}
	return pcrs, nil
}
