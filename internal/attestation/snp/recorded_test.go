package snp

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/verify/testdata"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/collateral"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
)

// Recorded real SEV-SNP evidence, from go-sev-guest v0.15.0's
// verify/testdata: attestation.bin, a report from an AMD EPYC Milan
// machine, and vcek.testcer, the VCEK AMD's Key Distribution Service
// issued that chip for the report's TCB; trust.AskArkMilanVcekBytes is
// AMD's real Milan cert_chain (ASK, ARK).
const (
	recordedChainURL = "https://kdsintf.amd.com/vcek/v1/Milan/cert_chain"
	recordedVCEKURL  = "https://kdsintf.amd.com/vcek/v1/Milan/3ac3fe21e13fb0990eb28a802e3fb6a29483a6b0753590c951bdd3b8e53786184ca39e359669a2b76a1936776b564ea464cdce40c05f63c9b610c5068b006b5d?blSPL=2&teeSPL=0&snpSPL=5&ucodeSPL=68"
)

// recordedTime is when the recorded VCEK was valid.
var recordedTime = time.Date(2023, time.June, 1, 0, 0, 0, 0, time.UTC)

// TestRecordedRealReport runs the recorded real report through the
// production path with AMD's real roots (embedded in go-sev-guest): the
// report carries no certificates, so its VCEK comes from AMD KDS through
// collateral.Cache (recorded answers), then offline from the cache. The
// report's signature and the VCEK chain verify; only the nonce binding
// fails (the report was not made for this nonce), a check that runs once
// the signature and chain passed. A tampered report and a VCEK not issued
// by AMD (go-sev-guest's test hierarchy) are refused as signature failures; an empty offline cache
// says to fetch.
func TestRecordedRealReport(t *testing.T) {
	trust.ClearProductCertCache()
	ev, err := Evidence(testdata.AttestationBytes, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	kds := func(vcek []byte) collateral.Fetcher {
		return func(_ context.Context, url string) (http.Header, []byte, error) {
			switch url {
			case recordedChainURL:
				return nil, trust.AskArkMilanVcekBytes, nil
			case recordedVCEKURL:
				return nil, vcek, nil
			}
			return nil, nil, errors.New("404 " + url)
		}
	}
	verify := func(evidence []byte, cache *collateral.Cache) error {
		trust.ClearProductCertCache()
		cache.Now = func() time.Time { return recordedTime }
		v, err := NewReportVerifier(ReportPolicy{LaunchMeasurements: [][]byte{make([]byte, MeasurementSize)}, Collateral: cache}, func() time.Time { return recordedTime })
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.Verify(context.Background(), evidence, make([]byte, attestation.NonceSize))
		return err
	}
	dir := t.TempDir()
	if err := verify(ev, &collateral.Cache{Dir: dir, Upstream: kds(testdata.VcekBytes)}); !errors.Is(err, attestation.ErrNonce) {
		t.Fatalf("online: error = %v, want only the nonce binding to fail", err)
	}
	if err := verify(ev, &collateral.Cache{Dir: dir}); !errors.Is(err, attestation.ErrNonce) {
		t.Fatalf("offline from the cache: error = %v, want only the nonce binding to fail", err)
	}
	tampered := append([]byte(nil), testdata.AttestationBytes...)
	tampered[0x90] ^= 1 // a MEASUREMENT byte
	tamperedEv, err := Evidence(tampered, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(tamperedEv, &collateral.Cache{Dir: dir}); !errors.Is(err, attestation.ErrSignature) {
		t.Fatalf("tampered report: error = %v, want a signature failure", err)
	}
	forged := snptest.NewAMD(t, snptest.Options{}).Signer.Vcek.Raw
	if err := verify(ev, &collateral.Cache{Dir: t.TempDir(), Upstream: kds(forged)}); !errors.Is(err, attestation.ErrSignature) {
		t.Fatalf("a VCEK not issued by AMD: error = %v, want a signature failure", err)
	}
	if err := verify(ev, &collateral.Cache{Dir: t.TempDir()}); !errors.Is(err, attestation.ErrSignature) || !strings.Contains(err.Error(), "not cached") {
		t.Fatalf("offline with an empty cache: error = %v, want refused, saying to fetch", err)
	}
}
