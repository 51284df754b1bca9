package azurecvm

import (
	"bytes"
	"crypto/rsa"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"

	"github.com/google/go-sev-guest/abi"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
)

// The HCL report's layout (Microsoft's paravisor, OpenHCL's IGVM
// attestation report; azure-cvm-tooling's az-cvm-vtpm/src/hcl): a 32-byte
// header, the hardware report in a field of 1184 bytes (the larger of an
// SEV-SNP report and a TDX TD report), then IGVM_REQUEST_DATA: five
// little-endian uint32 (data size, version, report type, the hash type of
// REPORT_DATA, the runtime data's size) and the runtime data.
const (
	hclHeaderSize      = 32
	hclHardwareSize    = 1184
	igvmRequestOffset  = hclHeaderSize + hclHardwareSize
	igvmRequestHeader  = 20
	runtimeDataOffset  = igvmRequestOffset + igvmRequestHeader
	hclSignature       = 0x414c4348 // "HCLA"
	reportTypeSNP      = 2
	reportTypeTDX      = 4
	hashTypeSHA256     = 1
	userDataSize       = 64
	akKeyID            = "HCLAkPub"
	minAKModulusBits   = 2048
	maxRuntimeDataSize = 16 << 10
)

// maxHCLReportSize bounds the HCL report an evidence may carry: the vTPM's
// NV index holds about 2.6 KiB; the bound leaves room for larger runtime
// data without letting a peer make the verifier parse megabytes of JSON.
const maxHCLReportSize = runtimeDataOffset + maxRuntimeDataSize

// hclReport is a parsed HCL report of an SEV-SNP confidential VM.
type hclReport struct {
	// SNPReport is the SEV-SNP attestation report (1184 bytes), signed by
	// the chip's VCEK, whose REPORT_DATA[0:32] is SHA-256(RuntimeData).
	SNPReport []byte
	// RuntimeData is the JSON the report binds (runtimeData's fields).
	RuntimeData []byte
}

// parseHCLReport parses b, an HCL report as the vTPM's NV index
// 0x01400001 holds it (it may be followed by unused bytes). Only SEV-SNP
// reports with SHA-256 runtime-data binding are accepted. Errors wrap
// attestation.ErrMalformed and name the field that is wrong.
func parseHCLReport(b []byte) (*hclReport, error) {
	if len(b) < runtimeDataOffset {
		return nil, fmt.Errorf("%w: HCL report has %d bytes, want at least %d", attestation.ErrMalformed, len(b), runtimeDataOffset)
	}
	if len(b) > maxHCLReportSize {
		return nil, fmt.Errorf("%w: HCL report has %d bytes, at most %d allowed", attestation.ErrMalformed, len(b), maxHCLReportSize)
	}
	le := binary.LittleEndian
	if sig := le.Uint32(b[0:]); sig != hclSignature {
		return nil, fmt.Errorf("%w: HCL report signature %#x, want %#x (\"HCLA\")", attestation.ErrMalformed, sig, hclSignature)
	}
	req := b[igvmRequestOffset:]
	dataSize, reportType, hashType, runtimeSize := le.Uint32(req[0:]), le.Uint32(req[8:]), le.Uint32(req[12:]), le.Uint32(req[16:])
	switch reportType {
	case reportTypeSNP:
	case reportTypeTDX:
		return nil, fmt.Errorf("%w: HCL report holds a TDX TD report; variant %s takes SEV-SNP only", attestation.ErrMalformed, attestation.VariantAzureSNP)
	default:
		return nil, fmt.Errorf("%w: HCL report type %d, want %d (SEV-SNP)", attestation.ErrMalformed, reportType, reportTypeSNP)
	}
	if hashType != hashTypeSHA256 {
		return nil, fmt.Errorf("%w: HCL report binds its runtime data with hash type %d, want %d (SHA-256)", attestation.ErrMalformed, hashType, hashTypeSHA256)
	}
	if uint64(runtimeSize) > uint64(len(b)-runtimeDataOffset) {
		return nil, fmt.Errorf("%w: HCL runtime data of %d bytes overruns the %d-byte report", attestation.ErrMalformed, runtimeSize, len(b))
	}
	if uint64(dataSize) != igvmRequestHeader+uint64(runtimeSize) {
		return nil, fmt.Errorf("%w: HCL request data size %d, want %d (header and runtime data)", attestation.ErrMalformed, dataSize, igvmRequestHeader+runtimeSize)
	}
	return &hclReport{
		SNPReport:   bytes.Clone(b[hclHeaderSize : hclHeaderSize+abi.ReportSize]),
		RuntimeData: bytes.Clone(b[runtimeDataOffset : runtimeDataOffset+int(runtimeSize)]),
	}, nil
}

// runtimeData is the HCL report's runtime data: the paravisor's vTPM keys
// and the VM's configuration, and the user data the guest asked for.
type runtimeData struct {
	// Keys are JSON Web Keys (RFC 7517): "HCLAkPub", the vTPM's
	// attestation key, and "HCLEkPub", its endorsement key.
	Keys []jsonWebKey `json:"keys"`
	// VMConfiguration is the VM's configuration as Azure set it.
	VMConfiguration vmConfiguration `json:"vm-configuration"`
	// UserData is the 64 bytes the guest wrote to NV index 0x01400002
	// before reading the report, hex.
	UserData string `json:"user-data"`
}

// vmConfiguration is the runtime data's "vm-configuration".
type vmConfiguration struct {
	ConsoleEnabled bool   `json:"console-enabled"`
	SecureBoot     bool   `json:"secure-boot"`
	TPMEnabled     bool   `json:"tpm-enabled"`
	VMUniqueID     string `json:"vmUniqueId"`
}

// jsonWebKey is an RSA JSON Web Key (RFC 7518 §6.3.1).
type jsonWebKey struct {
	KeyID   string `json:"kid"`
	KeyType string `json:"kty"`
	N       string `json:"n"`
	E       string `json:"e"`
}

// parseRuntimeData decodes an HCL report's runtime data. Errors wrap
// attestation.ErrMalformed.
func parseRuntimeData(b []byte) (*runtimeData, error) {
	var rd runtimeData
	if err := json.Unmarshal(b, &rd); err != nil {
		return nil, fmt.Errorf("%w: HCL runtime data: %w", attestation.ErrMalformed, err)
	}
	return &rd, nil
}

// AttestationKey returns the vTPM attestation key the runtime data names
// ("HCLAkPub"): an RSA key of at least 2048 bits. Errors wrap
// attestation.ErrMalformed.
func (rd *runtimeData) AttestationKey() (*rsa.PublicKey, error) {
	for _, k := range rd.Keys {
		if k.KeyID != akKeyID {
			continue
		}
		if k.KeyType != "RSA" {
			return nil, fmt.Errorf("%w: HCL runtime data's %s is a %q key, want RSA", attestation.ErrMalformed, akKeyID, k.KeyType)
		}
		n, err := base64.RawURLEncoding.DecodeString(k.N)
		if err != nil {
			return nil, fmt.Errorf("%w: HCL runtime data's %s modulus: %w", attestation.ErrMalformed, akKeyID, err)
		}
		e, err := base64.RawURLEncoding.DecodeString(k.E)
		if err != nil || len(e) == 0 || len(e) > 4 {
			return nil, fmt.Errorf("%w: HCL runtime data's %s exponent %q is not 1 to 4 base64url bytes", attestation.ErrMalformed, akKeyID, k.E)
		}
		key := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		if key.N.BitLen() < minAKModulusBits || key.E < 3 || key.E%2 == 0 {
			return nil, fmt.Errorf("%w: HCL runtime data's %s is a %d-bit RSA key with exponent %d, want at least %d bits and an odd exponent",
				attestation.ErrMalformed, akKeyID, key.N.BitLen(), key.E, minAKModulusBits)
		}
		return key, nil
	}
	return nil, fmt.Errorf("%w: HCL runtime data names no %s key", attestation.ErrMalformed, akKeyID)
}

// CheckUserData reports whether the runtime data's user data is binding
// followed by zeros (64 bytes in all): the guest asked for this report
// for this binding. Errors wrap attestation.ErrNonce or ErrMalformed.
func (rd *runtimeData) CheckUserData(binding []byte) error {
	got, err := hex.DecodeString(rd.UserData)
	if err != nil || len(got) != userDataSize {
		return fmt.Errorf("%w: HCL runtime data's user-data is not %d bytes of hex", attestation.ErrMalformed, userDataSize)
	}
	if len(binding) > userDataSize {
		return errors.New("binding longer than the HCL user data")
	}
	want := make([]byte, userDataSize)
	copy(want, binding)
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%w: the HCL report's user-data is not this evidence's binding: the report was asked for another nonce", attestation.ErrNonce)
	}
	return nil
}

// userDataFor returns the 64 bytes a guest writes to NV index 0x01400002 to
// ask for an HCL report bound to binding: binding, then zeros.
func userDataFor(binding []byte) ([]byte, error) {
	if len(binding) > userDataSize {
		return nil, fmt.Errorf("binding of %d bytes: the HCL user data holds at most %d", len(binding), userDataSize)
	}
	out := make([]byte, userDataSize)
	copy(out, binding)
	return out, nil
}
