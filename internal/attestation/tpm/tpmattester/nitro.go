package tpmattester

import (
	"crypto/ecdsa"
	"errors"
	"fmt"
	"io"

	"github.com/fxamacker/cbor/v2"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// The NitroTPM's Nitro Security Module request (aws/NitroTPM-Tools
// nitro-tpm-attest): the guest writes a CBOR request to an NV index it
// defines, sends the vendor command TPM2_VENDOR_AWS_NSM_REQUEST naming
// that index, and reads the CBOR response from the same index.
const (
	// NSMRequestCommand is TPM2_VENDOR_AWS_NSM_REQUEST.
	NSMRequestCommand = tpmutil.Command(0x20000001)
	// nsmIndexFirst and nsmIndexLast bound the owner NV indices the
	// request may use (TCG's owner range 0x01800000-0x01BFFFFF).
	nsmIndexFirst = tpmutil.Handle(0x01bf0000)
	nsmIndexLast  = tpmutil.Handle(0x01bf00ff)
	// nsmIndexSize is the index's size: the response (a document of
	// about 5 KiB) is written into it. A TPM with smaller indices gets its
	// maximum.
	nsmIndexSize = 8192
	// tpmPTNVIndexMax is TPM_PT_NV_INDEX_MAX (TPM 2.0 Part 2, 6.13).
	tpmPTNVIndexMax = 0x117
)

// nsmRequest is the NSM API's Attestation request (CBOR, an externally
// tagged enum as aws-nitro-enclaves-nsm-api serialises it).
type nsmRequest struct {
	Attestation nsmAttestation `cbor:"Attestation"`
}

type nsmAttestation struct {
	UserData  []byte `cbor:"user_data"`
	Nonce     []byte `cbor:"nonce"`
	PublicKey []byte `cbor:"public_key"`
}

// nsmResponse is the NSM API's answer: the document, or an error name.
type nsmResponse struct {
	Attestation *struct {
		Document []byte `cbor:"document"`
	} `cbor:"Attestation"`
	Error string `cbor:"Error"`
}

// nitroDocument asks the NitroTPM at rw for an attestation document naming
// ak (its uncompressed point) and nonce. The caller holds the TPM.
func nitroDocument(rw io.ReadWriter, ak *ecdsa.PublicKey, nonce []byte) ([]byte, error) {
	point, err := ak.Bytes()
	if err != nil {
		return nil, fmt.Errorf("encoding the AK for the NitroTPM document: %w", err)
	}
	request, err := cbor.Marshal(nsmRequest{Attestation: nsmAttestation{Nonce: nonce, PublicKey: point}})
	if err != nil {
		return nil, err
	}
	index, err := freeNVIndex(rw)
	if err != nil {
		return nil, err
	}
	size := uint16(nsmIndexSize)
	if max, err := nvIndexMax(rw); err == nil && max < nsmIndexSize {
		size = uint16(max)
	}
	if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, index, "", "", nil, tpm2.AttrAuthWrite|tpm2.AttrAuthRead, size); err != nil {
		return nil, fmt.Errorf("defining NV index %#x for the NSM request: %w", index, err)
	}
	defer func() { _ = tpm2.NVUndefineSpace(rw, "", tpm2.HandleOwner, index) }()
	if err := tpm2.NVWrite(rw, index, index, "", request, 0); err != nil {
		return nil, fmt.Errorf("writing the NSM request to NV index %#x: %w", index, err)
	}
	_, code, err := tpmutil.RunCommand(rw, tpm2.TagSessions, NSMRequestCommand, index, index, passwordSession())
	if err == nil && code != tpmutil.RCSuccess {
		err = fmt.Errorf("response code %#x", uint32(code))
	}
	if err != nil {
		return nil, fmt.Errorf("TPM2_VENDOR_AWS_NSM_REQUEST (is this an EC2 instance with NitroTPM?): %w", err)
	}
	raw, err := tpm2.NVReadEx(rw, index, index, "", 0)
	if err != nil {
		return nil, fmt.Errorf("reading the NSM response from NV index %#x: %w", index, err)
	}
	var response nsmResponse
	// The response fills the start of the index; the rest is padding.
	if _, err := cbor.UnmarshalFirst(raw, &response); err != nil {
		return nil, fmt.Errorf("decoding the NSM response: %w", err)
	}
	switch {
	case response.Error != "":
		return nil, fmt.Errorf("the NSM refused the attestation request: %s", response.Error)
	case response.Attestation == nil || len(response.Attestation.Document) == 0:
		return nil, errors.New("the NSM answered without an attestation document")
	}
	return response.Attestation.Document, nil
}

// passwordSession is the authorisation area of one password session with
// an empty password (TPM 2.0 Part 1, 19.8.4): its size, TPM_RS_PW, an
// empty nonce, no attributes, an empty password.
func passwordSession() []byte {
	return []byte{0, 0, 0, 9, 0x40, 0, 0, 9, 0, 0, 0, 0, 0}
}

// freeNVIndex returns the first undefined index of the request range.
func freeNVIndex(rw io.ReadWriter) (tpmutil.Handle, error) {
	for index := nsmIndexFirst; index <= nsmIndexLast; index++ {
		if _, err := tpm2.NVReadPublic(rw, index); err != nil {
			return index, nil
		}
	}
	return 0, fmt.Errorf("no free NV index in %#x-%#x for the NSM request", nsmIndexFirst, nsmIndexLast)
}

// nvIndexMax returns the TPM's largest NV index (TPM_PT_NV_INDEX_MAX).
func nvIndexMax(rw io.ReadWriter) (uint32, error) {
	caps, _, err := tpm2.GetCapability(rw, tpm2.CapabilityTPMProperties, 1, tpmPTNVIndexMax)
	if err != nil {
		return 0, err
	}
	if len(caps) == 0 {
		return 0, errors.New("no TPM_PT_NV_INDEX_MAX")
	}
	prop, ok := caps[0].(tpm2.TaggedProperty)
	if !ok || prop.Tag != tpmPTNVIndexMax {
		return 0, errors.New("no TPM_PT_NV_INDEX_MAX")
	}
	return prop.Value, nil
}
