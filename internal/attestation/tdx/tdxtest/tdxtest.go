// Package tdxtest gives tests a TDX guest: a test-only Intel hierarchy
// (root → PCK platform CA → PCK certificate) that re-signs go-tdx-guest's
// real sample quote with chosen contents (no Intel keys ship with
// go-tdx-guest), and a go-tdx-guest quote provider answering any
// REPORTDATA with such a quote. Nothing it signs is trusted outside a test
// that names its root.
package tdxtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	pb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/testing/testdata"
	"google.golang.org/protobuf/proto"
)

// Intel is a test-only Intel hierarchy (root → PCK platform CA → PCK
// leaf) that re-signs the sample quote with chosen contents, since no Intel
// keys ship with go-tdx-guest.
type Intel struct {
	// Root is the hierarchy's root CA (in place of the Intel SGX Root CA).
	Root            *x509.Certificate
	chainPEM        []byte
	pckKey, attKey  *ecdsa.PrivateKey
	sampleExtension pkix.Extension
}

// NewIntel makes a hierarchy valid from an hour ago for a day.
func NewIntel(t testing.TB) *Intel {
	t.Helper()
	q := SampleQuote(t)
	block, _ := pem.Decode(q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetPckCertificateChainData().GetPckCertChain())
	sampleLeaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	f := &Intel{}
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
	f.Root = sign(rootTmpl, rootTmpl, &rootKey.PublicKey, rootKey)
	inter := sign(tmpl(2, "Intel SGX PCK Platform CA", true), f.Root, &interKey.PublicKey, rootKey)
	leafTmpl := tmpl(3, "Intel SGX PCK Certificate", false)
	// The PCK leaf must carry exactly six extensions, the SGX one among them.
	leafTmpl.ExtraExtensions = []pkix.Extension{f.sampleExtension}
	leafTmpl.SubjectKeyId = []byte{1, 2, 3, 4}
	leafTmpl.CRLDistributionPoints = []string{"https://pck-crl.invalid/"}
	leaf := sign(leafTmpl, inter, &f.pckKey.PublicKey, interKey)
	for _, c := range []*x509.Certificate{leaf, inter, f.Root} {
		f.chainPEM = append(f.chainPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return f
}

// Roots returns a pool holding Root.
func (f *Intel) Roots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(f.Root)
	return pool
}

// SampleQuote returns go-tdx-guest's sample quote (testdata.RawQuote), a
// real quote from an Intel Sapphire Rapids machine, decoded.
func SampleQuote(t testing.TB) *pb.QuoteV4 {
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

// Quote re-signs the sample quote after edit changed its TD quote body.
func (f *Intel) Quote(t testing.TB, edit func(body *pb.TDQuoteBody)) []byte {
	t.Helper()
	q := SampleQuote(t)
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

// RootPEM returns Root as PEM (a policy's tdx.roots).
func (f *Intel) RootPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Root.Raw}))
}

// Device is a go-tdx-guest quote provider answering any REPORTDATA with
// a quote edit shaped, signed by the hierarchy.
type Device struct {
	intel *Intel
	t     testing.TB
	edit  func(body *pb.TDQuoteBody)
}

// Device returns a quote provider; edit (may be nil) shapes each quote's body.
func (f *Intel) Device(t testing.TB, edit func(body *pb.TDQuoteBody)) *Device {
	return &Device{intel: f, t: t, edit: edit}
}

// IsSupported reports nil: the device is always there.
func (d *Device) IsSupported() error { return nil }

// GetRawQuote returns a quote whose REPORTDATA is reportData.
func (d *Device) GetRawQuote(reportData [64]byte) ([]uint8, error) {
	return d.intel.Quote(d.t, func(body *pb.TDQuoteBody) {
		if d.edit != nil {
			d.edit(body)
		}
		body.ReportData = reportData[:]
	}), nil
}
