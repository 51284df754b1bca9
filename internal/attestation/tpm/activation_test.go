package tpm_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/tpmattester"
)

// swtpmNode is a software TPM with its attester, EK public key and AK
// public area (as its evidence carries it).
type swtpmNode struct {
	attester *tpmattester.QuoteAttester
	ek       any
	ak       []byte
}

func newSwtpmNode(t *testing.T) *swtpmNode {
	t.Helper()
	sw, err := swtpm.Start(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	rw, err := sw.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	ek, err := client.EndorsementKeyRSA(rw)
	if err != nil {
		t.Fatal(err)
	}
	ekPub := ek.PublicKey()
	ek.Close()
	a, err := tpmattester.New(rw, tpmattester.Options{PCRs: testPCRs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	evidence, err := a.Attest(t.Context(), nil, newNonce(t))
	if err != nil {
		t.Fatal(err)
	}
	var ev attestationv1.TPMEvidence
	if err := proto.Unmarshal(evidence, &ev); err != nil {
		t.Fatal(err)
	}
	return &swtpmNode{attester: a, ek: ekPub, ak: ev.GetAttestationKey()}
}

// TestCredentialActivation: only the TPM holding both the EK and the AK a
// challenge was made for recovers its secret; an AK from another TPM, or
// another TPM answering, is refused by the TPM itself.
func TestCredentialActivation(t *testing.T) {
	a, b := newSwtpmNode(t), newSwtpmNode(t)
	tests := []struct {
		name     string
		ek       any
		ak       []byte
		answerer *swtpmNode
		ok       bool
	}{
		{"AK resident with the EK", a.ek, a.ak, a, true},
		{"AK of another TPM, answered there", a.ek, b.ak, b, false},
		{"AK of another TPM, answered by the EK's TPM", a.ek, b.ak, a, false},
		{"another TPM answers", a.ek, a.ak, b, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			challenge, secret, err := tpm.NewActivationChallenge(tt.ek, tt.ak)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tt.answerer.attester.ActivateCredential(challenge.Credential, challenge.EncryptedSecret)
			if tt.ok {
				if err != nil || !bytes.Equal(got, secret) {
					t.Fatalf("activation = %x, %v; want the secret", got, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("activation succeeded (secret recovered: %v)", bytes.Equal(got, secret))
			}
		})
	}
	if _, _, err := tpm.NewActivationChallenge(a.ek, []byte("not a TPMT_PUBLIC")); !errors.Is(err, attestation.ErrMalformed) {
		t.Fatalf("challenge for a malformed AK: %v, want ErrMalformed", err)
	}
}
