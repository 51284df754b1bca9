package swtpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

var pcrs = []int{4, 16}

func boot(version string) []tpm.Artefact {
	return []tpm.Artefact{tpm.BytesArtefact(4, "bootstrapper", []byte("gatehouse-bootstrapper "+version))}
}

// startBooted starts swtpm on dir, measures boot into it and returns an attester.
func startBooted(t testing.TB, dir, version string) (*TPM, *tpmattester.QuoteAttester) {
	t.Helper()
	sw, err := Start(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	rw, err := sw.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	log, err := tpmattester.MeasureBoot(rw, boot(version))
	if err != nil {
		t.Fatal(err)
	}
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: pcrs, EventLog: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return sw, a
}

func attestVerify(t *testing.T, a *tpmattester.QuoteAttester, pinned crypto.PublicKey, version string) error {
	t.Helper()
	ref, err := tpm.ReferenceValues(boot(version), pcrs)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpm.NewQuoteVerifier(tpm.QuotePolicy{PCRs: pcrs, ReferenceValues: ref, Endorsement: tpm.Endorsement{PinnedKeys: []crypto.PublicKey{pinned}}}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, attestation.NonceSize)
	_, _ = rand.Read(nonce)
	ev, err := a.Attest(context.Background(), []byte("user data"), nonce)
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Verify(context.Background(), ev, nonce)
	return err
}

func TestSWTPMAttestsAcrossReboots(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tpm")
	sw, a := startBooted(t, dir, "v1")
	ak := a.AttestationKey()
	if err := attestVerify(t, a, ak, "v1"); err != nil {
		t.Fatalf("first boot: %v", err)
	}
	if err := attestVerify(t, a, ak, "v2"); !errors.Is(err, attestation.ErrMeasurement) {
		t.Fatalf("verifying against other reference values: %v, want %v", err, attestation.ErrMeasurement)
	}
	_ = a.Close()
	sw.Stop()

	// A reboot keeps the TPM's seeds, so the AK is the same and stays pinned,
	// and resets the PCRs, so a changed boot shows.
	_, a2 := startBooted(t, dir, "v2")
	if !a2.AttestationKey().(interface{ Equal(crypto.PublicKey) bool }).Equal(ak) {
		t.Fatal("the attestation key changed across a swtpm restart")
	}
	if err := attestVerify(t, a2, ak, "v2"); err != nil {
		t.Fatalf("second boot with new software: %v", err)
	}
	if err := attestVerify(t, a2, ak, "v1"); !errors.Is(err, attestation.ErrMeasurement) {
		t.Fatalf("old reference values after the reboot: %v, want %v", err, attestation.ErrMeasurement)
	}
}

func TestSWTPMPCRsMatchExpected(t *testing.T) {
	sw, err := Start(t.Context(), filepath.Join(t.TempDir(), "fresh"))
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Stop()
	rw, err := sw.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if _, err := tpmattester.MeasureBoot(rw, boot("v1")); err != nil {
		t.Fatal(err)
	}
	got, err := client.ReadPCRs(rw, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: pcrs})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := tpm.ExpectedPCRs(boot("v1"), pcrs)
	for pcr, v := range want {
		if !bytes.Equal(got.GetPcrs()[pcr], v) {
			t.Errorf("PCR %d = %x, want %x", pcr, got.GetPcrs()[pcr], v)
		}
	}
}

func TestStopEndsTheProcess(t *testing.T) {
	sw, err := Start(t.Context(), filepath.Join(t.TempDir(), "tpm"))
	if err != nil {
		t.Fatal(err)
	}
	sw.Stop()
	select {
	case <-sw.done:
	default:
		t.Fatal("swtpm still runs after Stop")
	}
	sw.Stop() // idempotent
}

// BenchmarkAttestSWTPM measures one quote on swtpm over its socket, the
// per-node cost of the rig when many simulated nodes attest in parallel.
func BenchmarkAttestSWTPM(b *testing.B) {
	_, a := startBooted(b, b.TempDir(), "v1")
	nonce := make([]byte, 32)
	for b.Loop() {
		if _, err := a.Attest(b.Context(), []byte("key hash"), nonce); err != nil {
			b.Fatal(err)
		}
	}
}
