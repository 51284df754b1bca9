package tdx

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "github.com/google/go-tdx-guest/proto/tdx"
	tdxtesting "github.com/google/go-tdx-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/collateral"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tdx/tdxtest"
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

func TestVerify(t *testing.T) {
	f := tdxtest.NewIntel(t)
	nonce := bytes.Repeat([]byte{3}, attestation.NonceSize)
	userData := []byte("tls key hash")
	bind := func(b *pb.TDQuoteBody) { b.ReportData = attestation.Binding512(nonce, userData) }
	policy := func(change func(*TDQuotePolicy)) TDQuotePolicy {
		p := TDQuotePolicy{ReferenceValues: measurements.M{0: {Expected: mustHex(t, sampleMRTD)}}, TrustedRoots: f.Roots()}
		if change != nil {
			change(&p)
		}
		return p
	}
	tests := []struct {
		name     string
		edit     func(*pb.TDQuoteBody)
		tamper   func(raw []byte)
		policy   TDQuotePolicy
		nonce    []byte
		at       time.Time // when verified; zero: now
		wantErr  error
		wantText string
	}{
		{name: "genuine quote verifies", edit: bind, policy: policy(nil)},
		{
			name: "expired PCK certificate", edit: bind, policy: policy(nil), at: time.Now().Add(48 * time.Hour),
			wantErr: attestation.ErrSignature, wantText: "expired",
		},
		{
			name: "other TDX module (MRSEAM)", edit: bind,
			policy:  policy(func(p *TDQuotePolicy) { p.MrSeam = bytes.Repeat([]byte{7}, MeasurementSize) }),
			wantErr: attestation.ErrPolicy, wantText: "MR_SEAM",
		},
		{
			name: "other module signer (MRSIGNERSEAM)", edit: bind,
			policy:  policy(func(p *TDQuotePolicy) { p.MrSignerSeam = bytes.Repeat([]byte{7}, MeasurementSize) }),
			wantErr: attestation.ErrPolicy, wantText: "MRSIGNERSEAM",
		},
		{
			name: "other TD attributes", edit: bind,
			policy:  policy(func(p *TDQuotePolicy) { p.TdAttributes = []byte{0, 0, 0, 0x10, 0, 0, 0, 0} }),
			wantErr: attestation.ErrPolicy, wantText: "TD_ATTRIBUTES",
		},
		{
			name: "quoting enclave of another vendor", edit: bind,
			policy:  policy(func(p *TDQuotePolicy) { p.QeVendorID = bytes.Repeat([]byte{1}, 16) }),
			wantErr: attestation.ErrPolicy, wantText: "QE_VENDOR_ID",
		},
		{
			name: "quoting enclave below the minimum SVN", edit: bind,
			policy:  policy(func(p *TDQuotePolicy) { p.MinimumQeSvn = 0xffff }),
			wantErr: attestation.ErrPolicy, wantText: "QE security-version",
		},
		{
			name: "other XFAM", edit: bind,
			policy:  policy(func(p *TDQuotePolicy) { p.Xfam = bytes.Repeat([]byte{0xff}, 8) }),
			wantErr: attestation.ErrPolicy, wantText: "XFAM",
		},
		{
			name: "wrong MRTD", edit: bind,
			policy: policy(func(p *TDQuotePolicy) {
				p.ReferenceValues[0] = measurements.Measurement{Expected: make([]byte, MeasurementSize)}
			}),
			wantErr: attestation.ErrMeasurement, wantText: "index 0: expected 0000",
		},
		{
			name: "wrong RTMR", edit: bind,
			policy: policy(func(p *TDQuotePolicy) {
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
			policy:  policy(func(p *TDQuotePolicy) { p.TrustedRoots = nil }),
			wantErr: attestation.ErrSignature, wantText: "unknown authority",
		},
		{
			name: "debuggable TD", edit: func(b *pb.TDQuoteBody) { bind(b); b.TdAttributes[0] |= tdAttributesDebug },
			policy: policy(nil), wantErr: attestation.ErrPolicy, wantText: "debuggable",
		},
		{
			name: "TEE TCB SVN below minimum", edit: bind,
			policy:  policy(func(p *TDQuotePolicy) { p.MinimumTeeTcbSvn = append([]byte{9}, make([]byte, 15)...) }),
			wantErr: attestation.ErrPolicy, wantText: "less than the required minimum",
		},
		{
			name: "stale nonce", edit: bind, policy: policy(nil), nonce: bytes.Repeat([]byte{4}, attestation.NonceSize),
			wantErr: attestation.ErrNonce,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := f.Quote(t, tt.edit)
			if tt.tamper != nil {
				tt.tamper(raw)
			}
			ev, err := Evidence(raw, userData)
			if err != nil {
				t.Fatal(err)
			}
			clock := time.Now
			if !tt.at.IsZero() {
				clock = func() time.Time { return tt.at }
			}
			v, err := NewTDQuoteVerifier(tt.policy, clock)
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
	v, err := NewTDQuoteVerifier(TDQuotePolicy{ReferenceValues: measurements.M{0: {Expected: mustHex(t, sampleMRTD)}}}, func() time.Time { return sampleTime })
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Verify(context.Background(), ev, make([]byte, attestation.NonceSize))
	if !errors.Is(err, attestation.ErrNonce) {
		t.Fatalf("error = %v, want only the nonce binding to fail", err)
	}
}

// TestRealIntelQuoteWithPCSCollateral runs go-tdx-guest's real quote with
// its recorded Intel PCS answers (TCB info and QE identity for the
// platform's FMSPC, PCK CRL and root CA CRL, with their issuer chain
// headers; go-tdx-guest testing.TestGetter, testing/testdata) through the
// production path: collateral.Cache online, then offline from the cache,
// at a time all of them were valid. The collateral verifies (its issuer
// chains to the Intel SGX root, its signatures, the PCK and root CRLs),
// and then the quote is refused as it is on the real path: its platform's
// TCB level is none of the recorded TCB info's levels (the sample comes
// from a pre-production Sapphire Rapids E4 part), a check that runs only
// once everything before it passed. Once the TCB info is past its
// nextUpdate the offline cache refuses it; an empty one says to fetch.
func TestRealIntelQuoteWithPCSCollateral(t *testing.T) {
	ev, err := Evidence(testdata.RawQuote, nil)
	if err != nil {
		t.Fatal(err)
	}
	recorded := func(_ context.Context, url string) (http.Header, []byte, error) {
		h, body, err := tdxtesting.TestGetter.Get(url)
		return h, body, err
	}
	dir := t.TempDir()
	verify := func(cache *collateral.Cache, at time.Time) error {
		cache.Now = func() time.Time { return at }
		v, err := NewTDQuoteVerifier(TDQuotePolicy{
			ReferenceValues: measurements.M{0: {Expected: mustHex(t, sampleMRTD)}},
			Collateral:      cache.TDX(), CheckRevocations: true,
		}, func() time.Time { return at })
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.Verify(context.Background(), ev, make([]byte, attestation.NonceSize))
		return err
	}
	const tcbLevelMissing = "failed TCB status check: no matching TCB level found"
	if err := verify(&collateral.Cache{Dir: dir, Upstream: recorded}, sampleTime); !errors.Is(err, attestation.ErrSignature) || !strings.Contains(err.Error(), tcbLevelMissing) {
		t.Fatalf("online: error = %v, want the collateral verified and the TCB level refused", err)
	}
	if err := verify(&collateral.Cache{Dir: dir}, sampleTime); !errors.Is(err, attestation.ErrSignature) || !strings.Contains(err.Error(), tcbLevelMissing) {
		t.Fatalf("offline from the cache: error = %v, want the collateral verified and the TCB level refused", err)
	}
	forged := func(ctx context.Context, url string) (http.Header, []byte, error) {
		h, body, err := recorded(ctx, url)
		if i := bytes.Index(body, []byte(`"signature":"`)); i >= 0 && strings.Contains(url, "/tcb?") {
			body = bytes.Clone(body)
			if j := i + len(`"signature":"`); body[j] == '0' {
				body[j] = '1'
			} else {
				body[j] = '0' // still hex: a wrong signature, not a malformed one
			}
		}
		return h, body, err
	}
	if err := verify(&collateral.Cache{Dir: t.TempDir(), Upstream: forged}, sampleTime); !errors.Is(err, attestation.ErrSignature) || strings.Contains(err.Error(), tcbLevelMissing) {
		t.Fatalf("forged TCB info signature: error = %v, want refused before the TCB level", err)
	}
	if err := verify(&collateral.Cache{Dir: dir}, sampleTime.AddDate(0, 1, 0)); !errors.Is(err, attestation.ErrSignature) || !strings.Contains(err.Error(), "past its next update") {
		t.Fatalf("offline with stale TCB info: error = %v, want refused", err)
	}
	if err := verify(&collateral.Cache{Dir: t.TempDir()}, sampleTime); !errors.Is(err, attestation.ErrSignature) || !strings.Contains(err.Error(), "not cached") {
		t.Fatalf("offline with an empty cache: error = %v, want refused", err)
	}
}

func TestVerifyMalformed(t *testing.T) {
	v, err := NewTDQuoteVerifier(TDQuotePolicy{ReferenceValues: measurements.M{0: {Expected: mustHex(t, sampleMRTD)}}}, time.Now)
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
	intel := tdxtest.NewIntel(f)
	nonce := bytes.Repeat([]byte{3}, attestation.NonceSize)
	userData := []byte("tls key hash")
	raw := intel.Quote(f, func(b *pb.TDQuoteBody) { b.ReportData = attestation.Binding512(nonce, userData) })
	seed, err := Evidence(raw, userData)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	v, err := NewTDQuoteVerifier(TDQuotePolicy{ReferenceValues: measurements.M{0: {Expected: mustHex(f, sampleMRTD)}}, TrustedRoots: intel.Roots()}, time.Now)
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
