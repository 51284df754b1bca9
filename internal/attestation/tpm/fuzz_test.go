package tpm_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
)

// FuzzVerify feeds the verifier mutations of genuine evidence from the
// simulator TPM: it must never panic, and whatever verifies must carry the
// genuine user data.
func FuzzVerify(f *testing.F) {
	fx := newFixture(f)
	nonce := newNonce(f)
	userData := []byte("key hash")
	evidence, err := fx.attester.Attest(context.Background(), userData, nonce)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(evidence)
	f.Add([]byte{})
	v := fx.verifier(f)
	f.Fuzz(func(t *testing.T, ev []byte) {
		result, err := v.Verify(context.Background(), ev, nonce)
		if err == nil && !bytes.Equal(result.UserData, userData) {
			t.Fatalf("evidence verified with user data %q", result.UserData)
		}
	})
}

// FuzzReplayEventLog: parsing and replaying any bytes must not panic, and a
// log replayed against its own result must pass.
func FuzzReplayEventLog(f *testing.F) {
	seed, err := proto.Marshal(&attestationv1.EventLog{Events: []*attestationv1.Event{
		{Pcr: 4, Digest: bytes.Repeat([]byte{1}, 32), Description: "file:/usr/bin/gatehouse-bootstrapper"},
		{Pcr: 16, Digest: bytes.Repeat([]byte{2}, 32)},
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{0x0a, 0x02, 0x08, 0x18})
	f.Fuzz(func(t *testing.T, data []byte) {
		log, err := tpm.ParseEventLog(data)
		if err != nil {
			return
		}
		var artefacts []tpm.Artefact
		pcrs := map[int]bool{}
		for _, e := range log.GetEvents() {
			a := tpm.Artefact{PCR: int(e.GetPcr())}
			copy(a.Digest[:], e.GetDigest())
			artefacts = append(artefacts, a)
			pcrs[a.PCR] = true
		}
		var sel []int
		for p := range pcrs {
			sel = append(sel, p)
		}
		expected, err := tpm.ExpectedPCRs(artefacts, sel)
		if err != nil {
			t.Fatalf("a parsed log names an unmeasurable PCR: %v", err)
		}
		if err := tpm.ReplayEventLog(data, expected); err != nil {
			t.Fatalf("log does not replay to its own expected values: %v", err)
		}
	})
}

// FuzzParseActivationChallenge: a challenge comes from the network (a
// verifier, to a node); parsing never panics and a parsed one is complete.
func FuzzParseActivationChallenge(f *testing.F) {
	valid, err := proto.Marshal(&attestationv1.TPMActivationChallenge{Credential: []byte{0, 2, 1, 2}, EncryptedSecret: []byte{0, 1, 9}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := tpm.ParseActivationChallenge(data)
		if err != nil {
			if !errors.Is(err, attestation.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if len(c.Credential) < 2 || len(c.EncryptedSecret) < 2 {
			t.Fatalf("parsed an incomplete challenge %+v", c)
		}
	})
}
