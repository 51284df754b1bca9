package tpm_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"github.com/veraison/go-cose"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

// nsm plays the Nitro Security Module behind a TPM simulator: it answers
// TPM2_VENDOR_AWS_NSM_REQUEST as a NitroTPM does (aws/NitroTPM-Tools),
// reading the CBOR request from the NV index the command names and
// writing there a CBOR response holding an attestation document (a
// COSE_Sign1, ES384) signed by a test CA standing in for AWS's, with the
// simulator's SHA-384 PCRs and the requester's public key and nonce.
type nsm struct {
	sim     io.ReadWriter
	t       *testing.T
	root    *x509.Certificate
	leaf    *x509.Certificate
	key     *ecdsa.PrivateKey
	pcrs    map[uint32][]byte
	mu      sync.Mutex
	pending []byte // the vendor command's response, for the next Read
}

func (n *nsm) Write(b []byte) (int, error) {
	if len(b) >= 18 && binary.BigEndian.Uint32(b[6:]) == uint32(tpmattester.NSMRequestCommand) {
		n.answer(tpmutil.Handle(binary.BigEndian.Uint32(b[14:])))
		return len(b), nil
	}
	return n.sim.Write(b)
}

func (n *nsm) Read(b []byte) (int, error) {
	n.mu.Lock()
	pending := n.pending
	n.pending = nil
	n.mu.Unlock()
	if pending != nil {
		return copy(b, pending), nil
	}
	return n.sim.Read(b)
}

// answer serves one request in NV index.
func (n *nsm) answer(index tpmutil.Handle) {
	// TPM_ST_SESSIONS, size 19, TPM_RC_SUCCESS, no parameters, one
	// password session's response (empty nonce, no attributes, empty HMAC).
	ok := []byte{0x80, 0x02, 0, 0, 0, 19, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	defer func() { n.mu.Lock(); n.pending = ok; n.mu.Unlock() }()
	raw, err := tpm2.NVReadEx(n.sim, index, index, "", 0)
	if err != nil {
		n.t.Error(err)
		return
	}
	var req struct {
		Attestation struct {
			Nonce     []byte `cbor:"nonce"`
			PublicKey []byte `cbor:"public_key"`
		} `cbor:"Attestation"`
	}
	if _, err := cbor.UnmarshalFirst(raw, &req); err != nil {
		n.t.Error(err)
		return
	}
	payload, err := cbor.Marshal(map[string]any{
		"module_id": "i-0123456789abcdef0-tpm0123456789abcdef", "digest": "SHA384", "timestamp": uint64(time.Now().UnixMilli()),
		"nitrotpm_pcrs": n.pcrs, "certificate": n.leaf.Raw, "cabundle": [][]byte{n.root.Raw},
		"public_key": req.Attestation.PublicKey, "user_data": nil, "nonce": req.Attestation.Nonce,
	})
	if err != nil {
		n.t.Error(err)
		return
	}
	msg := cose.Sign1Message{Headers: cose.Headers{Protected: cose.ProtectedHeader{cose.HeaderLabelAlgorithm: cose.AlgorithmES384}}, Payload: payload}
	signer, err := cose.NewSigner(cose.AlgorithmES384, n.key)
	if err != nil {
		n.t.Error(err)
		return
	}
	if err := msg.Sign(rand.Reader, nil, signer); err != nil {
		n.t.Error(err)
		return
	}
	document, err := (*cose.UntaggedSign1Message)(&msg).MarshalCBOR()
	if err != nil {
		n.t.Error(err)
		return
	}
	response, err := cbor.Marshal(map[string]any{"Attestation": map[string]any{"document": document}})
	if err != nil {
		n.t.Error(err)
		return
	}
	for off := 0; off < len(response); off += 512 {
		if err := tpm2.NVWrite(n.sim, index, index, "", response[off:min(off+512, len(response))], uint16(off)); err != nil {
			n.t.Errorf("writing the NSM response (%d bytes): %v", len(response), err)
			return
		}
	}
}

// newNSM makes the test CA (root and document-signing leaf, ECDSA P-384)
// and the SHA-384 PCRs the documents show.
func newNSM(t *testing.T, sim io.ReadWriter) *nsm {
	t.Helper()
	rootKey, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rootTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test nitro root"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, &rootKey.PublicKey, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	root, err := x509.ParseCertificate(rootDER)
	if err != nil {
		t.Fatal(err)
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "test nitro document signer"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(3 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}, root, &leafKey.PublicKey, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(leafDER)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := map[uint32][]byte{}
	for i := range uint32(8) {
		pcrs[i] = bytes.Repeat([]byte{byte(i + 1)}, 48)
	}
	return &nsm{sim: sim, t: t, root: root, leaf: leaf, key: leafKey, pcrs: pcrs}
}

// TestNitroAttester: the attester with --attestation-key aws-nitro on a
// TPM simulator behind an emulated Nitro Security Module asks, for every
// evidence, for a document naming its AK and the quote's binding; the
// production verifier with the awsNitroTPM endorsement (the test CA as
// root) accepts it for its nonce and refuses it for another, and refuses
// documents showing other SHA-384 PCRs. A TPM without the vendor command
// (the bare simulator) says what is missing, and the NV index the request
// used is gone.
func TestNitroAttester(t *testing.T) {
	sim := newSimulator(t)
	emulated := newNSM(t, sim)
	a, err := tpmattester.New(emulated, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKAWSNitro})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	roots := x509.NewCertPool()
	roots.AddCert(emulated.root)
	refs := measurements.M{}
	for i, v := range emulated.pcrs {
		refs[i] = measurements.Measurement{Expected: v}
	}
	verifier := func(refs measurements.M) *tpm.QuoteVerifier {
		v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: testPCRs, Endorsement: tpm.Endorsement{Nitro: &tpm.NitroEndorsement{ReferenceValues: refs, AnyInstance: true, Roots: roots}}}, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	nonce := newNonce(t)
	evidence, err := a.Attest(t.Context(), []byte("tls key"), nonce)
	if err != nil {
		t.Fatal(err)
	}
	result, err := verifier(refs).Verify(t.Context(), evidence, nonce)
	if err != nil {
		t.Fatalf("evidence with the emulated NitroTPM's document: %v", err)
	}
	if !strings.HasPrefix(result.Endorsement, "aws-nitrotpm instance=i-0123456789abcdef0 ") {
		t.Fatalf("endorsement %q", result.Endorsement)
	}
	if _, err := verifier(refs).Verify(t.Context(), evidence, newNonce(t)); !errors.Is(err, attestation.ErrNonce) {
		t.Fatalf("another nonce: error = %v, want %v", err, attestation.ErrNonce)
	}
	other := measurements.M{4: measurements.Measurement{Expected: make([]byte, 48)}}
	if _, err := verifier(other).Verify(t.Context(), evidence, nonce); !errors.Is(err, attestation.ErrMeasurement) {
		t.Fatalf("other SHA-384 reference values: error = %v, want %v", err, attestation.ErrMeasurement)
	}

	bare, err := tpmattester.New(sim, tpmattester.Options{PCRs: testPCRs, AttestationKey: tpmattester.AKAWSNitro})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bare.Close() })
	if _, err := bare.Attest(t.Context(), nil, nonce); err == nil || !strings.Contains(err.Error(), "is this an EC2 instance with NitroTPM?") {
		t.Fatalf("a TPM without the NSM: %v", err)
	}
	if _, err := tpm2.NVReadPublic(sim, 0x01bf0000); err == nil {
		t.Fatal("the NSM request's NV index was left defined")
	}
}
