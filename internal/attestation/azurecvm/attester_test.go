package azurecvm_test

import (
	"bytes"
	"context"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/azurecvm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/snp/snptest"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

var (
	paravisorLaunch = bytes.Repeat([]byte{0xcc}, snp.MeasurementSize)
	testTCB         = kds.TCBParts{BlSpl: 3, SnpSpl: 8, UcodeSpl: 115}
	quotedPCRs      = []int{4, 15}
)

// paravisor plays Azure's paravisor behind a TPM simulator: after the
// guest's TPM2_NV_Write to the HCL user data index, it writes a fresh HCL
// report to NV index 0x01400001 — an SEV-SNP report from the test AMD
// hierarchy whose REPORT_DATA binds runtime data naming the vTPM's AK and
// the user data written, as the real paravisor does.
type paravisor struct {
	sim     io.ReadWriteCloser
	device  *snptest.Device
	t       testing.TB
	mu      sync.Mutex
	command []byte
	ak      *rsa.PublicKey
	vcek    []byte
}

const ccNVWrite = 0x00000137 // TPM_CC_NV_Write (TPM 2.0 Part 2, 6.5.2)

func (p *paravisor) Write(b []byte) (int, error) {
	p.mu.Lock()
	p.command = bytes.Clone(b)
	p.mu.Unlock()
	return p.sim.Write(b)
}

func (p *paravisor) Read(b []byte) (int, error) {
	n, err := p.sim.Read(b)
	p.mu.Lock()
	cmd := p.command
	p.command = nil
	p.mu.Unlock()
	// A successful NV_Write (response code 0) to the user data index.
	if err == nil && n >= 10 && binary.BigEndian.Uint32(b[6:]) == 0 && len(cmd) >= 18 &&
		binary.BigEndian.Uint32(cmd[6:]) == ccNVWrite && binary.BigEndian.Uint32(cmd[14:]) == uint32(azurecvm.HCLUserDataNV) {
		authSize := int(binary.BigEndian.Uint32(cmd[18:]))
		data := cmd[22+authSize:]
		size := int(binary.BigEndian.Uint16(data))
		p.publish(data[2 : 2+size])
	}
	return n, err
}

func (p *paravisor) Close() error { return p.sim.Close() }

// publish writes the HCL report for userData to NV index 0x01400001.
func (p *paravisor) publish(userData []byte) {
	runtime, err := json.Marshal(map[string]any{
		"keys": []map[string]string{{"kid": "HCLAkPub", "kty": "RSA",
			"n": base64.RawURLEncoding.EncodeToString(p.ak.N.Bytes()),
			"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(p.ak.E)).Bytes())}},
		"vm-configuration": map[string]any{"secure-boot": true, "tpm-enabled": true, "vmUniqueId": "test-vm"},
		"user-data":        fmt.Sprintf("%X", userData),
	})
	if err != nil {
		p.t.Error(err)
		return
	}
	sum := sha256.Sum256(runtime)
	var reportData [abi.ReportDataSize]byte
	copy(reportData[:], sum[:])
	raw, err := p.device.GetRawQuote(reportData)
	if err != nil {
		p.t.Error(err)
		return
	}
	table := &abi.CertTable{}
	if err := table.Unmarshal(raw[abi.ReportSize:]); err != nil {
		p.t.Error(err)
		return
	}
	p.mu.Lock()
	p.vcek = table.Proto().GetVcekCert()
	p.mu.Unlock()
	report := hclReport(raw[:abi.ReportSize], runtime)
	if _, err := tpm2.NVReadPublic(p.sim, azurecvm.HCLReportNV); err == nil {
		if err := tpm2.NVUndefineSpace(p.sim, "", tpm2.HandleOwner, azurecvm.HCLReportNV); err != nil {
			p.t.Error(err)
			return
		}
	}
	if err := tpm2.NVDefineSpace(p.sim, tpm2.HandleOwner, azurecvm.HCLReportNV, "", "", nil,
		tpm2.AttrOwnerWrite|tpm2.AttrOwnerRead, uint16(len(report))); err != nil {
		p.t.Error(err)
		return
	}
	for off := 0; off < len(report); off += 1024 {
		end := min(off+1024, len(report))
		if err := tpm2.NVWrite(p.sim, tpm2.HandleOwner, azurecvm.HCLReportNV, "", report[off:end], uint16(off)); err != nil {
			p.t.Error(err)
			return
		}
	}
}

// hclReport lays out an HCL report (docs/attestation.md, "Azure
// confidential VMs"): header, the hardware report field, IGVM request
// data, the runtime data.
func hclReport(snpReport, runtime []byte) []byte {
	out := make([]byte, 32+1184+20, 32+1184+20+len(runtime))
	le := binary.LittleEndian
	le.PutUint32(out[0:], 0x414c4348) // "HCLA"
	le.PutUint32(out[4:], 1)
	le.PutUint32(out[8:], uint32(len(out)+len(runtime)))
	le.PutUint32(out[12:], 2)
	copy(out[32:], snpReport)
	req := out[32+1184:]
	le.PutUint32(req[0:], uint32(20+len(runtime)))
	le.PutUint32(req[4:], 1)
	le.PutUint32(req[8:], 2)  // SEV-SNP
	le.PutUint32(req[12:], 1) // SHA-256
	le.PutUint32(req[16:], uint32(len(runtime)))
	return append(out, runtime...)
}

// azureVM is a simulated Azure confidential VM: a TPM simulator whose AK
// sits at Azure's persistent handle, behind the emulated paravisor.
func azureVM(t *testing.T, amd *snptest.AMD) *paravisor {
	t.Helper()
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	ak, err := client.NewKey(sim, tpm2.HandleOwner, client.AKTemplateRSA())
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm2.EvictControl(sim, "", tpm2.HandleOwner, ak.Handle(), tpmattester.AzureAKHandle); err != nil {
		t.Fatal(err)
	}
	pub := ak.PublicKey().(*rsa.PublicKey)
	ak.Close()
	p := &paravisor{sim: sim, t: t, ak: pub, device: amd.Device(t, snptest.Report{Measurement: paravisorLaunch})}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func thim(t *testing.T, p *paravisor) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata") != "true" {
			http.Error(w, "Required metadata header not specified", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		vcek := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.vcek})
		p.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"vcekCert": string(vcek), "tcbm": "7300000000000003"})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestAttesterOnEmulatedParavisor: the attester on a TPM simulator whose
// AK sits at Azure's handle, behind an emulated paravisor that issues HCL
// reports signed by a test AMD hierarchy, produces evidence the production
// verifier accepts for this nonce, carrying the user data; the same
// evidence is refused for another nonce, and by a policy naming another
// paravisor. Concurrent attestations each get a report for their own
// binding (the NV write and read are not interleaved).
func TestAttesterOnEmulatedParavisor(t *testing.T) {
	amd := snptest.NewAMD(t, snptest.Options{TCB: testTCB})
	vm := azureVM(t, amd)
	q, err := tpmattester.New(vm, tpmattester.Options{PCRs: quotedPCRs, AttestationKey: tpmattester.AKAzure})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	a, err := azurecvm.NewAttester(q, azurecvm.THIM(http.DefaultClient, thim(t, vm)))
	if err != nil {
		t.Fatal(err)
	}
	verifier := func(launch []byte) *azurecvm.Verifier {
		vmpl := 0
		report, err := snp.NewReportVerifier(snp.ReportPolicy{LaunchMeasurements: [][]byte{launch}, MinimumTCB: testTCB, TrustedRoots: amd.Roots(), VMPL: &vmpl}, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		vtpm, err := tpm.NewBoundVerifier(tpm.QuotePolicy{PCRs: quotedPCRs}, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		v, err := azurecvm.NewVerifier(report, vtpm)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := verifier(paravisorLaunch)
	nonce := bytes.Repeat([]byte{9}, attestation.NonceSize)
	userData := []byte("hash of the node's TLS key")

	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			n := bytes.Repeat([]byte{byte(i + 1)}, attestation.NonceSize)
			ev, err := a.Attest(context.Background(), userData, n)
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := v.Verify(context.Background(), ev, n); err != nil {
				t.Errorf("attestation %d: %v", i, err)
			}
		})
	}
	wg.Wait()

	ev, err := a.Attest(t.Context(), userData, nonce)
	if err != nil {
		t.Fatal(err)
	}
	result, err := v.Verify(t.Context(), ev, nonce)
	if err != nil {
		t.Fatalf("evidence of the emulated Azure confidential VM: %v", err)
	}
	wantID, err := q.Identity()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(result.UserData, userData) || result.Identity != wantID || result.Variant != attestation.VariantAzureSNP {
		t.Fatalf("result: user data %q, identity %s (want %s), variant %s", result.UserData, result.Identity, wantID, result.Variant)
	}
	if _, err := v.Verify(t.Context(), ev, bytes.Repeat([]byte{8}, attestation.NonceSize)); !errors.Is(err, attestation.ErrNonce) {
		t.Fatalf("another nonce: error = %v, want %v", err, attestation.ErrNonce)
	}
	if _, err := verifier(make([]byte, snp.MeasurementSize)).Verify(t.Context(), ev, nonce); !errors.Is(err, attestation.ErrMeasurement) {
		t.Fatalf("another paravisor: error = %v, want %v", err, attestation.ErrMeasurement)
	}
}

// TestAttesterOutsideAzure: on a vTPM without Azure's AK the quote
// attester says what is missing, and on one without the HCL report index
// the attester does.
func TestAttesterOutsideAzure(t *testing.T) {
	sim, err := simulator.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	if _, err := tpmattester.New(sim, tpmattester.Options{PCRs: quotedPCRs, AttestationKey: tpmattester.AKAzure}); err == nil ||
		!bytes.Contains([]byte(err.Error()), []byte("persistent handle 0x81000003")) {
		t.Fatalf("no Azure AK: error = %v", err)
	}
	if _, err := azurecvm.ReadHCLReport(sim, make([]byte, 32)); err == nil || !bytes.Contains([]byte(err.Error()), []byte("is this an Azure confidential VM?")) {
		t.Fatalf("no HCL report: error = %v", err)
	}
}

// FuzzParseTHIM: any answer parses or fails without panicking.
func FuzzParseTHIM(f *testing.F) {
	f.Add([]byte(`{"vcekCert":"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n","tcbm":"7300000000000003"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		_, _ = azurecvm.ParseTHIM(body)
	})
}
