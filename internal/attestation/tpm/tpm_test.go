package tpm_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"io"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
)

var testPCRs = []int{0, 4, 15, 16}

// newSimulator opens the in-process TPM simulator (one per process at a time).
func newSimulator(t testing.TB) io.ReadWriter {
	t.Helper()
	sim, err := simulator.Get()
	if err != nil {
		t.Fatalf("opening TPM simulator: %v", err)
	}
	t.Cleanup(func() {
		if err := sim.Close(); err != nil {
			t.Errorf("closing TPM simulator: %v", err)
		}
	})
	return sim
}

func newNonce(t testing.TB) []byte {
	t.Helper()
	n := make([]byte, attestation.NonceSize)
	if _, err := rand.Read(n); err != nil {
		t.Fatal(err)
	}
	return n
}

// bootArtefacts is a small measured boot: a "binary" and a "configuration".
func bootArtefacts() []tpm.Artefact {
	return []tpm.Artefact{
		tpm.BytesArtefact(4, "bootstrapper", []byte("gatehouse-bootstrapper binary")),
		tpm.BytesArtefact(4, "bootstrapper config", []byte("joinServiceEndpoint: 10.0.0.1:9090")),
		tpm.BytesArtefact(16, "debug", []byte("test")),
	}
}

// fixture is a booted simulator TPM with an attester and a matching verifier.
type fixture struct {
	tpm      io.ReadWriter
	log      []byte // the boot's event log
	attester *tpmattester.QuoteAttester
	policy   tpm.QuotePolicy
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	rw := newSimulator(t)
	log, err := tpmattester.MeasureBoot(rw, bootArtefacts())
	if err != nil {
		t.Fatal(err)
	}
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs, EventLog: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	ref, err := tpm.ReferenceValues(bootArtefacts(), testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{
		tpm:      rw,
		log:      log,
		attester: a,
		policy: tpm.QuotePolicy{
			PCRs:            testPCRs,
			ReferenceValues: ref,
			Endorsement:     tpm.Endorsement{PinnedKeys: []crypto.PublicKey{a.AttestationKey()}},
		},
	}
}

func (f *fixture) verifier(t testing.TB) *tpm.QuoteVerifier {
	t.Helper()
	v, err := tpm.NewQuoteVerifier(f.policy, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAttestAndVerify(t *testing.T) {
	f := newFixture(t)
	nonce := newNonce(t)
	userData := []byte("hash of a TLS key")
	evidence, err := f.attester.Attest(context.Background(), userData, nonce)
	if err != nil {
		t.Fatal(err)
	}
	result, err := f.verifier(t).Verify(context.Background(), evidence, nonce)
	if err != nil {
		t.Fatalf("verifying fresh evidence: %v", err)
	}
	if !bytes.Equal(result.UserData, userData) {
		t.Errorf("user data = %q, want %q", result.UserData, userData)
	}
	if !strings.HasPrefix(result.Identity, "tpm-ak:sha256:") {
		t.Errorf("identity = %q", result.Identity)
	}
	want, _ := tpm.ExpectedPCRs(bootArtefacts(), testPCRs)
	for pcr, v := range want {
		if !bytes.Equal(result.Measurements[pcr], v) {
			t.Errorf("PCR %d = %x, want %x", pcr, result.Measurements[pcr], v)
		}
	}
}

func TestExpectedPCRsMatchTheTPM(t *testing.T) {
	rw := newSimulator(t)
	if _, err := tpmattester.MeasureBoot(rw, bootArtefacts()); err != nil {
		t.Fatal(err)
	}
	pcrs, err := client.ReadPCRs(rw, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: testPCRs})
	if err != nil {
		t.Fatal(err)
	}
	want, err := tpm.ExpectedPCRs(bootArtefacts(), testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	for pcr, v := range want {
		if got := pcrs.GetPcrs()[pcr]; !bytes.Equal(got, v) {
			t.Errorf("PCR %d: TPM has %x, tpm.ExpectedPCRs computed %x", pcr, got, v)
		}
	}
}

func TestWarnOnlyMismatchIsReported(t *testing.T) {
	f := newFixture(t)
	f.policy.ReferenceValues[15] = measurements.Measurement{Expected: bytes.Repeat([]byte{1}, 32), WarnOnly: true}
	nonce := newNonce(t)
	evidence, err := f.attester.Attest(context.Background(), nil, nonce)
	if err != nil {
		t.Fatal(err)
	}
	result, err := f.verifier(t).Verify(context.Background(), evidence, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if len(result.Warnings) != 1 || !strings.Contains(result.Warnings[0], "PCR index 15") {
		t.Errorf("warnings = %q, want one for PCR 15", result.Warnings)
	}
}

func TestNewVerifierRefusesBadPolicies(t *testing.T) {
	key := &ecdsa.PublicKey{}
	tests := []struct {
		name    string
		policy  tpm.QuotePolicy
		wantErr string
	}{
		{name: "no PCRs", policy: tpm.QuotePolicy{Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{key}}}, wantErr: "no PCRs selected"},
		{name: "PCR out of range", policy: tpm.QuotePolicy{PCRs: []int{24}, Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{key}}}, wantErr: "PCR 24 out of range"},
		{name: "no endorsement", policy: tpm.QuotePolicy{PCRs: []int{0}}, wantErr: "set exactly one of"},
		{name: "both endorsements", policy: tpm.QuotePolicy{PCRs: []int{0}, Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{key}, Roots: x509.NewCertPool()}}, wantErr: "set exactly one of"},
		{
			name:    "reference value outside the selection",
			policy:  tpm.QuotePolicy{PCRs: []int{0}, ReferenceValues: measurements.M{7: {}}, Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{key}}},
			wantErr: "reference value for PCR 7",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tpm.NewQuoteVerifier(tt.policy, time.Now); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// akCertificate issues a certificate for the AK from a fresh CA valid during
// [notBefore, notAfter] and returns the CA pool and the chain.
func akCertificate(t *testing.T, ak crypto.PublicKey, notBefore, notAfter time.Time) (*x509.CertPool, [][]byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test AK CA"},
		NotBefore: notBefore, NotAfter: notAfter.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "test AK"},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, ak, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, [][]byte{leafDER}
}

// certified returns an attester on the fixture's TPM that presents chain as
// its AK's certificates. The AK is the same on every start of a TPM.
func (f *fixture) certified(t testing.TB, chain [][]byte) *tpmattester.QuoteAttester {
	t.Helper()
	a, err := tpmattester.New(f.tpm, tpmattester.Options{PCRs: testPCRs, EventLog: f.log, AKCertificates: chain})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func TestAKCertificateChain(t *testing.T) {
	f := newFixture(t)
	now := time.Now()
	pool, chain := akCertificate(t, f.attester.AttestationKey(), now.Add(-time.Hour), now.Add(time.Hour))
	certified := f.certified(t, chain)
	f.policy.Endorsement = tpm.Endorsement{Roots: pool}
	nonce := newNonce(t)
	evidence, err := certified.Attest(context.Background(), nil, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.verifier(t).Verify(context.Background(), evidence, nonce); err != nil {
		t.Fatalf("verifying with a certified AK: %v", err)
	}
}

// mutate decodes evidence, applies change and re-encodes it.
func mutate(t testing.TB, evidence []byte, change func(*attestationv1.TPMEvidence)) []byte {
	t.Helper()
	ev := &attestationv1.TPMEvidence{}
	if err := proto.Unmarshal(evidence, ev); err != nil {
		t.Fatal(err)
	}
	change(ev)
	out, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestVerifyRejects is the negative suite for evidence made by a real
// (simulated) TPM: every case must fail with its specific error.
func TestVerifyRejects(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	nonce := newNonce(t)
	evidence, err := f.attester.Attest(ctx, []byte("key hash"), nonce)
	if err != nil {
		t.Fatal(err)
	}
	otherAK, err := client.NewKey(f.tpm, tpm2.HandleEndorsement, client.AKTemplateECC())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(otherAK.Close)
	now := time.Now()
	// akChain, when a case's policy sets it, is the AK certificate chain the
	// case's evidence carries.
	var akChain [][]byte

	tests := []struct {
		name     string
		evidence func(t *testing.T) []byte
		nonce    []byte
		policy   func(p *tpm.QuotePolicy)
		wantErr  error
		wantText string
	}{
		{
			name:     "replayed evidence (old nonce)",
			evidence: func(*testing.T) []byte { return evidence },
			nonce:    newNonce(t),
			wantErr:  attestation.ErrNonce, wantText: "extraData is not SHA-256(nonce || user data)",
		},
		{
			name:     "short nonce",
			evidence: func(*testing.T) []byte { return evidence },
			nonce:    nonce[:16],
			wantErr:  attestation.ErrNonce, wantText: "nonce has 16 bytes",
		},
		{
			name: "user data swapped (evidence moved to another key)",
			evidence: func(t *testing.T) []byte {
				return mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { ev.UserData = []byte("another key") })
			},
			wantErr: attestation.ErrNonce,
		},
		{
			name:     "wrong PCR value",
			evidence: func(*testing.T) []byte { return evidence },
			policy: func(p *tpm.QuotePolicy) {
				p.ReferenceValues[4] = measurements.Measurement{Expected: bytes.Repeat([]byte{0xee}, 32)}
			},
			wantErr: attestation.ErrMeasurement, wantText: "index 4: expected eeee",
		},
		{
			name:     "PCR selection mismatch",
			evidence: func(*testing.T) []byte { return evidence },
			policy:   func(p *tpm.QuotePolicy) { p.PCRs = []int{0, 4, 15, 16, 17} },
			wantErr:  attestation.ErrPolicy, wantText: "policy requires exactly [0 4 15 16 17]",
		},
		{
			name: "tampered quote bytes",
			evidence: func(t *testing.T) []byte {
				return mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { ev.Quote[len(ev.Quote)-1] ^= 1 })
			},
			wantErr: attestation.ErrSignature,
		},
		{
			name: "tampered signature",
			evidence: func(t *testing.T) []byte {
				return mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { ev.Signature[len(ev.Signature)-1] ^= 1 })
			},
			wantErr: attestation.ErrSignature,
		},
		{
			name: "reported PCR value does not match the quoted digest",
			evidence: func(t *testing.T) []byte {
				return mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { ev.Pcrs[4] = bytes.Repeat([]byte{1}, 32) })
			},
			wantErr: attestation.ErrSignature, wantText: "do not hash to the quoted PCR digest",
		},
		{
			name: "missing PCR value",
			evidence: func(t *testing.T) []byte {
				return mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { delete(ev.Pcrs, 4) })
			},
			wantErr: attestation.ErrMalformed,
		},
		{
			name: "signature by an untrusted AK",
			evidence: func(t *testing.T) []byte {
				return mutate(t, evidence, func(ev *attestationv1.TPMEvidence) {
					pub, err := otherAK.PublicArea().Encode()
					if err != nil {
						t.Fatal(err)
					}
					ev.AttestationKey = pub
				})
			},
			wantErr: attestation.ErrUntrustedKey, wantText: "is not pinned",
		},
		{
			name:     "expired AK certificate",
			evidence: func(*testing.T) []byte { return evidence },
			policy: func(p *tpm.QuotePolicy) {
				pool, chain := akCertificate(t, f.attester.AttestationKey(), now.Add(-2*time.Hour), now.Add(-time.Hour))
				p.Endorsement = tpm.Endorsement{Roots: pool}
				akChain = chain
			},
			wantErr: attestation.ErrUntrustedKey, wantText: "expired",
		},
		{
			name:     "AK certificate from an untrusted CA",
			evidence: func(*testing.T) []byte { return evidence },
			policy: func(p *tpm.QuotePolicy) {
				_, chain := akCertificate(t, f.attester.AttestationKey(), now.Add(-time.Hour), now.Add(time.Hour))
				other, _ := akCertificate(t, f.attester.AttestationKey(), now.Add(-time.Hour), now.Add(time.Hour))
				p.Endorsement = tpm.Endorsement{Roots: other}
				akChain = chain
			},
			wantErr: attestation.ErrUntrustedKey, wantText: "unknown authority",
		},
		{
			name:     "AK certificate for another key",
			evidence: func(*testing.T) []byte { return evidence },
			policy: func(p *tpm.QuotePolicy) {
				pool, chain := akCertificate(t, otherAK.PublicKey(), now.Add(-time.Hour), now.Add(time.Hour))
				p.Endorsement = tpm.Endorsement{Roots: pool}
				akChain = chain
			},
			wantErr: attestation.ErrUntrustedKey, wantText: "certificate is for another key",
		},
		{
			name: "event log that does not replay",
			evidence: func(t *testing.T) []byte {
				log, err := proto.Marshal(&attestationv1.EventLog{Events: []*attestationv1.Event{{Pcr: 4, Digest: make([]byte, 32)}}})
				if err != nil {
					t.Fatal(err)
				}
				return mutate(t, evidence, func(ev *attestationv1.TPMEvidence) { ev.EventLog = log })
			},
			wantErr: attestation.ErrPolicy, wantText: "event log does not replay to the value of PCR 4",
		},
		{
			name:     "garbage evidence",
			evidence: func(*testing.T) []byte { return []byte("\xff\xff\xff garbage") },
			wantErr:  attestation.ErrMalformed,
		},
		{
			// Field 99 is in no TPMEvidence version: a verifier must not
			// accept content it cannot interpret alongside a valid quote.
			name: "evidence with a field the verifier does not know",
			evidence: func(t *testing.T) []byte {
				return protowire.AppendVarint(protowire.AppendTag(slices.Clone(evidence), 99, protowire.VarintType), 1)
			},
			wantErr: attestation.ErrMalformed, wantText: "has fields this version does not know",
		},
		{
			name:     "oversized evidence",
			evidence: func(*testing.T) []byte { return make([]byte, attestation.MaxEvidenceSize+1) },
			wantErr:  attestation.ErrMalformed, wantText: "at most 131072 allowed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := f.policy
			policy.ReferenceValues = measurements.M{}
			for k, v := range f.policy.ReferenceValues {
				policy.ReferenceValues[k] = v
			}
			akChain = nil
			if tt.policy != nil {
				tt.policy(&policy)
			}
			ev := tt.evidence(t)
			if akChain != nil {
				// The case made an AK certificate: attest again to carry it.
				var err error
				if ev, err = f.certified(t, akChain).Attest(ctx, []byte("key hash"), nonce); err != nil {
					t.Fatal(err)
				}
			}
			v, err := tpm.NewQuoteVerifier(policy, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			n := nonce
			if tt.nonce != nil {
				n = tt.nonce
			}
			_, err = v.Verify(ctx, ev, n)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantText != "" && !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantText)
			}
		})
	}
}

func TestSHA1OnlyQuoteIsRefused(t *testing.T) {
	f := newFixture(t)
	nonce := newNonce(t)
	ak, err := client.NewKey(f.tpm, tpm2.HandleOwner, client.AKTemplateECC())
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	q, err := ak.Quote(tpm2.PCRSelection{Hash: tpm2.AlgSHA1, PCRs: testPCRs}, attestation.Binding256(nonce, nil))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := ak.PublicArea().Encode()
	ev, _ := proto.Marshal(&attestationv1.TPMEvidence{
		Quote: q.GetQuote(), Signature: q.GetRawSig(), PcrHashAlgorithm: uint32(q.GetPcrs().GetHash()),
		Pcrs: q.GetPcrs().GetPcrs(), AttestationKey: pub,
	})
	_, err = f.verifier(t).Verify(context.Background(), ev, nonce)
	if !errors.Is(err, attestation.ErrPolicy) || !strings.Contains(err.Error(), "SHA-1 PCR bank") {
		t.Fatalf("error = %v, want the SHA-1 bank refused", err)
	}
}

func TestAttesterSerialisesConcurrentQuotes(t *testing.T) {
	f := newFixture(t)
	v := f.verifier(t)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			nonce := make([]byte, attestation.NonceSize)
			_, _ = rand.Read(nonce)
			ev, err := f.attester.Attest(context.Background(), nil, nonce)
			if err == nil {
				_, err = v.Verify(context.Background(), ev, nonce)
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestAKCertificateCriticalExtensions: an AK certificate may carry the TCG
// profiles' critical subjectAltName naming a TPM (as Compute Engine's do),
// which crypto/x509 leaves unhandled; any other unhandled critical
// extension is still refused.
func TestAKCertificateCriticalExtensions(t *testing.T) {
	f := newFixture(t)
	ek, err := x509.ParseCertificate(readTestdata(t, "swtpm-ek-rsa.der"))
	if err != nil {
		t.Fatal(err)
	}
	var tpmSAN pkix.Extension
	for _, ext := range ek.Extensions {
		if ext.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}) {
			tpmSAN = ext
		}
	}
	if !tpmSAN.Critical {
		t.Fatal("the testdata EK certificate lacks its critical TPM subjectAltName")
	}
	ca := testkit.NewCA(t, "test AK CA")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	f.policy.Endorsement = tpm.Endorsement{Roots: pool}
	for _, tt := range []struct {
		name string
		ext  pkix.Extension
		says string
	}{
		{"TPM subjectAltName", tpmSAN, ""},
		{"unknown critical extension", pkix.Extension{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Critical: true, Value: []byte{5, 0}}, "unhandled critical extension"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
				KeyUsage: x509.KeyUsageDigitalSignature, ExtraExtensions: []pkix.Extension{tt.ext}}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, f.attester.AttestationKey(), ca.Key)
			if err != nil {
				t.Fatal(err)
			}
			nonce := newNonce(t)
			evidence, err := f.certified(t, [][]byte{der}).Attest(context.Background(), nil, nonce)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.verifier(t).Verify(context.Background(), evidence, nonce)
			if tt.says == "" {
				if err != nil {
					t.Fatalf("AK certificate with the TPM subjectAltName: %v", err)
				}
				return
			}
			if !errors.Is(err, attestation.ErrUntrustedKey) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("got %v, want ErrUntrustedKey saying %q", err, tt.says)
			}
		})
	}
}
