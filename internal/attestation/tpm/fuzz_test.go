package tpm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-eventlog/testdata"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	attestationv1 "github.com/gatehouse-dev/gatehouse/api/attestation/v1"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
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

// FuzzTCGEventLog feeds the TCG event log path (go-eventlog's parse and
// replay, the events' descriptions, ExplainMismatches) arbitrary logs and
// PCR values: it must never panic, a replay must return only events of
// the PCRs given, with 32-byte digests and short printable descriptions,
// and every explanation must name its PCR. pcrBytes gives PCR values in
// 33-byte records (index mod 24, then the value); empty, the log's own
// unverified replay is used, so mutated logs also reach the success path.
func FuzzTCGEventLog(f *testing.F) {
	uki := synthesize(f, []tpm2.Algorithm{tpm2.AlgSHA1, tpm2.AlgSHA256}, ukiBoot("gatehouse.role=worker"))
	// The Ubuntu log of TestTCGEventLogAttacks (45 KiB) is too big to minimise quickly.
	for _, log := range [][]byte{ovmfUKILog(f), testdata.ArchLinuxWorkstationEventLog, uki, testdata.Debian10EventLog[:2048], uki[:len(uki)/2]} {
		f.Add(log, []byte{})
	}
	f.Add(uki, append([]byte{11}, bytes.Repeat([]byte{7}, 32)...))
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, log, pcrBytes []byte) {
		pcrs := map[uint32][]byte{}
		for i := 0; i+33 <= len(pcrBytes) && i < 33*24; i += 33 {
			pcrs[uint32(pcrBytes[i]%24)] = pcrBytes[i+1 : i+33]
		}
		if len(pcrBytes) == 0 {
			pcrs = ownReplay(log)
		}
		events, err := tpm.ReplayTCGEventLog(log, pcrs)
		if err != nil {
			if !errors.Is(err, attestation.ErrMalformed) && !errors.Is(err, attestation.ErrPolicy) {
				t.Fatalf("error wraps neither ErrMalformed nor ErrPolicy: %v", err)
			}
			return
		}
		for _, e := range events {
			if _, ok := pcrs[e.PCR]; !ok || len(e.Digest) != sha256.Size {
				t.Fatalf("event %+v: PCR not given or digest not 32 bytes", e)
			}
			if n := utf8.RuneCountInString(e.Description); n > 161 || strings.ContainsFunc(e.Description, func(r rune) bool { return !unicode.IsPrint(r) }) {
				t.Fatalf("description %q: %d characters or not printable", e.Description, n)
			}
		}
		ref := measurements.M{}
		for index := range pcrs {
			ref[index] = measurements.Measurement{Expected: make([]byte, 32), Events: []measurements.Event{{Type: "EV_IPL", Description: ".cmdline", Digest: make([]byte, 32)}}}
			if index%2 == 0 {
				ref[index] = measurements.Measurement{Expected: make([]byte, 32)}
			}
		}
		for _, sentence := range tpm.ExplainMismatches(ref, pcrs, events) {
			if !strings.HasPrefix(sentence, "PCR ") {
				t.Fatalf("explanation %q names no PCR", sentence)
			}
		}
	})
}

// ownReplay replays log's SHA-256 digests as go-eventlog reads them,
// without checking anything: the PCR values a machine writing log would
// have, where it parses.
func ownReplay(log []byte) map[uint32][]byte {
	pcrs := map[uint32][]byte{}
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{})
	if err != nil {
		return pcrs
	}
	for _, e := range el.Events(register.HashSHA256) {
		if e.Type == tcg.NoAction || e.Index < 0 || e.Index > 23 || len(e.Digest) != sha256.Size {
			continue
		}
		v, ok := pcrs[uint32(e.Index)]
		if !ok {
			v = make([]byte, sha256.Size)
		}
		pcrs[uint32(e.Index)] = sum(append(v, e.Digest...))
	}
	return pcrs
}
