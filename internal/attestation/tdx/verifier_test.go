package tdx

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/testing/testdata"
	"google.golang.org/protobuf/proto"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
)

// sampleMRTD is MR_TD of go-tdx-guest's sample quote (testdata.RawQuote), a
// real quote from an Intel Sapphire Rapids machine.
const sampleMRTD = "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb"

// sampleTime is when the sample quote's PCK chain was valid.
var sampleTime = time.Date(2023, 7, 1, 1, 0, 0, 0, time.UTC)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeIntel is a test-only Intel hierarchy (root → PCK platform CA → PCK
// leaf) that re-signs the sample quote with chosen contents, since no Intel
// keys ship with go-tdx-guest.
type fakeIntel struct {
	root            *x509.Certificate
	chainPEM        []byte
	pckKey, attKey  *ecdsa.PrivateKey
	sampleExtension pkix.Extension
}

func newFakeIntel(t testing.TB) *fakeIntel {
	t.Helper()
	q := sampleQuote(t)
	block, _ := pem.Decode(q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetPckCertificateChainData().GetPckCertChain())
	sampleLeaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeIntel{}
	for _, e := range sampleLeaf.Extensions {
		if e.Id.Equal(pcs.OidSgxExtension) {
			f.sampleExtension = e
		}
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	rootKey, interKey := key(), key()
	f.pckKey, f.attKey = key(), key()
	now := time.Now()
	tmpl := func(serial int64, cn string, ca bool) *x509.Certificate {
		return &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn, Organization: []string{"Fake Intel"}},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), SignatureAlgorithm: x509.ECDSAWithSHA256,
			IsCA: ca, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		}
	}
	sign := func(c, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) *x509.Certificate {
		der, err := x509.CreateCertificate(rand.Reader, c, parent, pub, signer)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(der)
		return cert
	}
	rootTmpl := tmpl(1, "Intel SGX Root CA", true)
	f.root = sign(rootTmpl, rootTmpl, &rootKey.PublicKey, rootKey)
	inter := sign(tmpl(2, "Intel SGX PCK Platform CA", true), f.root, &interKey.PublicKey, rootKey)
	leafTmpl := tmpl(3, "Intel SGX PCK Certificate", false)
	// The PCK leaf must carry exactly six extensions, the SGX one among them.
	leafTmpl.ExtraExtensions = []pkix.Extension{f.sampleExtension}
	leafTmpl.SubjectKeyId = []byte{1, 2, 3, 4}
	leafTmpl.CRLDistributionPoints = []string{"https://pck-crl.invalid/"}
	leaf := sign(leafTmpl, inter, &f.pckKey.PublicKey, interKey)
	for _, c := range []*x509.Certificate{leaf, inter, f.root} {
		f.chainPEM = append(f.chainPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return f
}

func (f *fakeIntel) roots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(f.root)
	return pool
}

func sampleQuote(t testing.TB) *pb.QuoteV4 {
	t.Helper()
	q, err := abi.QuoteToProto(testdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	return proto.Clone(q.(*pb.QuoteV4)).(*pb.QuoteV4)
}

func signRS(t testing.TB, key *ecdsa.PrivateKey, msg []byte) []byte {
	t.Helper()
	h := sha256.Sum256(msg)
	r, s, err := ecdsa.Sign(rand.Reader, key, h[:])
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 64)
	r.FillBytes(out[:32])
	s.FillBytes(out[32:])
	return out
}

// quote re-signs the sample quote after edit changed its TD quote body.
func (f *fakeIntel) quote(t testing.TB, edit func(body *pb.TDQuoteBody)) []byte {
	t.Helper()
	q := sampleQuote(t)
	cd := q.GetSignedData().GetCertificationData()
	qe := cd.GetQeReportCertificationData()
	delta := uint32(len(f.chainPEM)) - uint32(len(qe.GetPckCertificateChainData().GetPckCertChain()))
	q.SignedDataSize += delta
	cd.Size += delta
	qe.GetPckCertificateChainData().PckCertChain = f.chainPEM
	qe.GetPckCertificateChainData().Size = uint32(len(f.chainPEM))

	attPub := make([]byte, 64)
	f.attKey.X.FillBytes(attPub[:32])
	f.attKey.Y.FillBytes(attPub[32:])
	q.GetSignedData().EcdsaAttestationKey = attPub
	h := sha256.Sum256(append(append([]byte{}, attPub...), qe.GetQeAuthData().GetData()...))
	qe.GetQeReport().ReportData = append(h[:], make([]byte, 32)...)
	qeRaw, err := abi.EnclaveReportToAbiBytes(qe.GetQeReport())
	if err != nil {
		t.Fatal(err)
	}
	qe.QeReportSignature = signRS(t, f.pckKey, qeRaw)

	edit(q.GetTdQuoteBody())
	header, err := abi.HeaderToAbiBytes(q.GetHeader())
	if err != nil {
		t.Fatal(err)
	}
	body, err := abi.TdQuoteBodyToAbiBytes(q.GetTdQuoteBody())
	if err != nil {
		t.Fatal(err)
	}
	q.GetSignedData().Signature = signRS(t, f.attKey, append(header, body...))
	raw, err := abi.QuoteToAbiBytes(q)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestVerify(t *testing.T) {
	f := newFakeIntel(t)
	nonce := bytes.Repeat([]byte{3}, attestation.NonceSize)
	userData := []byte("tls key hash")
	bind := func(b *pb.TDQuoteBody) { b.ReportData = attestation.Binding512(nonce, userData) }
	policy := func(change func(*Policy)) Policy {
		p := Policy{ReferenceValues: measurements.M{0: {Expected: mustHex(t, sampleMRTD)}}, TrustedRoots: f.roots()}
		if change != nil {
			change(&p)
		}
		return p
	}
	tests := []struct {
		name     string
		edit     func(*pb.TDQuoteBody)
		tamper   func(raw []byte)
		policy   Policy
		nonce    []byte
		wantErr  error
		wantText string
	}{
		{name: "genuine quote verifies", edit: bind, policy: policy(nil)},
		{
			name: "wrong MRTD", edit: bind,
			policy: policy(func(p *Policy) {
				p.ReferenceValues[0] = measurements.Measurement{Expected: make([]byte, MeasurementSize)}
			}),
			wantErr: attestation.ErrMeasurement, wantText: "index 0: expected 0000",
		},
		{
			name: "wrong RTMR", edit: bind,
			policy: policy(func(p *Policy) {
				p.ReferenceValues[4] = measurements.Measurement{Expected: bytes.Repeat([]byte{1}, MeasurementSize)}
			}),
			wantErr: attestation.ErrMeasurement, wantText: "index 4",
		},
		{
			name: "bad signature", edit: bind, policy: policy(nil),
			tamper:  func(raw []byte) { raw[0x238] ^= 1 }, // a REPORTDATA byte, after signing
			wantErr: attestation.ErrSignature, wantText: "unable to verify message digest",
		},
		{
			name: "PCK chain to an untrusted root (the real Intel root)", edit: bind,
			policy:  policy(func(p *Policy) { p.TrustedRoots = nil }),
			wantErr: attestation.ErrSignature, wantText: "unknown authority",
		},
		{
			name: "debuggable TD", edit: func(b *pb.TDQuoteBody) { bind(b); b.TdAttributes[0] |= tdAttributesDebug },
			policy: policy(nil), wantErr: attestation.ErrPolicy, wantText: "debuggable",
		},
		{
			name: "TEE TCB SVN below minimum", edit: bind,
			policy:  policy(func(p *Policy) { p.MinimumTeeTcbSvn = append([]byte{9}, make([]byte, 15)...) }),
			wantErr: attestation.ErrPolicy, wantText: "less than the required minimum",
		},
		{
			name: "stale nonce", edit: bind, policy: policy(nil), nonce: bytes.Repeat([]byte{4}, attestation.NonceSize),
			wantErr: attestation.ErrNonce,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := f.quote(t, tt.edit)
			if tt.tamper != nil {
				tt.tamper(raw)
			}
			ev, err := Evidence(raw, userData)
			if err != nil {
				t.Fatal(err)
			}
			v, err := NewVerifier(tt.policy, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			n := nonce
			if tt.nonce != nil {
				n = tt.nonce
			}
			result, err := v.Verify(context.Background(), ev, n)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(result.UserData, userData) || !strings.HasPrefix(result.Identity, "tdx-ppid:") {
					t.Errorf("result %+v", result)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("error = %v, want %v containing %q", err, tt.wantErr, tt.wantText)
			}
		})
	}
}

// TestRealIntelQuote verifies the real sample quote against the real Intel
// root as of when it was valid: the chain and signature hold, and only the
// nonce binding (which no real quote can have for our nonce) fails.
func TestRealIntelQuote(t *testing.T) {
	ev, err := Evidence(testdata.RawQuote, nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(Policy{ReferenceValues: measurements.M{0: {Expected: mustHex(t, sampleMRTD)}}}, func() time.Time { return sampleTime })
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Verify(context.Background(), ev, make([]byte, attestation.NonceSize))
	if !errors.Is(err, attestation.ErrNonce) {
		t.Fatalf("error = %v, want only the nonce binding to fail", err)
	}
}

func TestVerifyMalformed(t *testing.T) {
	v, err := NewVerifier(Policy{ReferenceValues: measurements.M{0: {Expected: mustHex(t, sampleMRTD)}}}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	truncated, _ := Evidence(testdata.RawQuote[:100], nil)
	for name, ev := range map[string][]byte{
		"garbage":         []byte("\xff\xffgarbage"),
		"oversized":       make([]byte, attestation.MaxEvidenceSize+1),
		"truncated quote": truncated,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := v.Verify(context.Background(), ev, make([]byte, attestation.NonceSize)); !errors.Is(err, attestation.ErrMalformed) {
				t.Fatalf("error = %v, want %v", err, attestation.ErrMalformed)
			}
		})
	}
}

// FuzzVerify feeds the verifier mutations of a genuine (fake-Intel) quote:
// it must never panic, and what verifies must carry the genuine user data.
func FuzzVerify(f *testing.F) {
	intel := newFakeIntel(f)
	nonce := bytes.Repeat([]byte{3}, attestation.NonceSize)
	userData := []byte("tls key hash")
	raw := intel.quote(f, func(b *pb.TDQuoteBody) { b.ReportData = attestation.Binding512(nonce, userData) })
	seed, err := Evidence(raw, userData)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	v, err := NewVerifier(Policy{ReferenceValues: measurements.M{0: {Expected: mustHex(f, sampleMRTD)}}, TrustedRoots: intel.roots()}, time.Now)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, evidence []byte) {
		result, err := v.Verify(context.Background(), evidence, nonce)
		if err == nil && !bytes.Equal(result.UserData, userData) {
			t.Fatalf("evidence verified with user data %q", result.UserData)
		}
	})
}
