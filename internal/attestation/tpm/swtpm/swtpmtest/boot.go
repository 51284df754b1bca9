package swtpmtest

import (
	"io"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

// Boot starts swtpm on its state in dir (a new one when dir holds none;
// swtpm.Manufacture it first for an EK certificate), measures artefacts
// into it as a boot would, and returns the open TPM.
func Boot(t testing.TB, dir string, artefacts []tpm.Artefact) io.ReadWriter {
	t.Helper()
	dev, err := swtpm.Start(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dev.Stop)
	rw, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	if _, err := tpmattester.MeasureBoot(rw, artefacts); err != nil {
		t.Fatal(err)
	}
	return rw
}
