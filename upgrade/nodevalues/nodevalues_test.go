package nodevalues_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
	"github.com/gatehouse-dev/gatehouse/upgrade/nodevalues"
)

// digest is a PCR value of 32 bytes b.
func digest(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// values are reference values: PCR index → the byte its value repeats.
func values(pcrs map[uint32]byte) measurements.M {
	m := measurements.M{}
	for i, b := range pcrs {
		m[i] = measurements.Measurement{Expected: digest(b)}
	}
	return m
}

func raw(t *testing.T, pcrs map[uint32]byte) json.RawMessage {
	t.Helper()
	y, err := values(pcrs).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func akPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}))
}

// Node software in the tests: v1 and v2 of an image (PCRs 4 and 11, the
// role in PCR 11) and a namespace kind of node (PCRs 4 and 8).
var (
	imageV1CP     = map[uint32]byte{4: 0x41, 11: 0xc1}
	imageV1Worker = map[uint32]byte{4: 0x41, 11: 0xd1}
	imageV2CP     = map[uint32]byte{4: 0x42, 11: 0xc2}
	imageV2Worker = map[uint32]byte{4: 0x42, 11: 0xd2}
	nsWorker      = map[uint32]byte{4: 0xee, 8: 0x77}
)

func measured(pcrs map[uint32]byte) map[uint32][]byte {
	out := map[uint32][]byte{}
	for i, b := range pcrs {
		out[i] = digest(b)
	}
	return out
}

func imageV2() signedvalues.Values {
	return signedvalues.Values{Platform: "qemu-ovmf", Image: signedvalues.Image{Name: "gatehouse-node", Version: "2"},
		Roles: map[policy.Role]measurements.M{policy.RoleControlPlane: values(imageV2CP), policy.RoleWorker: values(imageV2Worker)}}
}

func basePolicy(t *testing.T) policy.Policy {
	t.Helper()
	return policy.Policy{
		// Common values empty, as a local cluster with VM nodes has them.
		Variant: "tpm", PCRs: []int{4, 8, 11, 15}, PinnedAKs: []string{akPEM(t)}, ReferenceValues: json.RawMessage("{}"),
		Roles: map[policy.Role]policy.RolePolicy{
			policy.RoleControlPlane: {ReferenceValues: raw(t, imageV1CP)},
			policy.RoleWorker:       {ReferenceValues: raw(t, imageV1Worker), AlsoAccepted: []json.RawMessage{raw(t, nsWorker)}},
		},
	}
}

// roles compiles p and returns the roles measured satisfies.
func roles(t *testing.T, p policy.Policy, m map[uint32]byte) []policy.Role {
	t.Helper()
	a, err := p.Appraisal(time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a.Roles(measured(m))
}

// TestMove: the whole move. Accepting v2 keeps v1 nodes and admits v2
// nodes of the right role only; a retirement while a node still proves
// v1 retires nothing of that role and names the node; once every node
// proves v2 (or another kind's set), v1 is gone: a node still measuring
// v1 then gets no role, while the namespace kind's worker set stays.
func TestMove(t *testing.T) {
	p := basePolicy(t)
	accepted, changed, err := nodevalues.Accept(p, imageV2())
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 2 {
		t.Fatalf("changed %q, want the two roles' new sets", changed)
	}
	if len(p.Roles[policy.RoleWorker].AlsoAccepted) != 1 {
		t.Fatal("Accept changed the caller's policy")
	}
	for _, tt := range []struct {
		name string
		m    map[uint32]byte
		want []policy.Role
	}{
		{"v1 control plane", imageV1CP, []policy.Role{policy.RoleControlPlane}},
		{"v2 control plane", imageV2CP, []policy.Role{policy.RoleControlPlane}},
		{"v2 worker", imageV2Worker, []policy.Role{policy.RoleWorker}},
		{"namespace worker", nsWorker, []policy.Role{policy.RoleWorker}},
		{"v2's PCR 4 with v1's PCR 11", map[uint32]byte{4: 0x42, 11: 0xd1}, nil},
	} {
		if got := roles(t, accepted, tt.m); !slices.Equal(got, tt.want) {
			t.Errorf("accepted policy, %s: roles %v, want %v", tt.name, got, tt.want)
		}
	}
	again, changed, err := nodevalues.Accept(accepted, imageV2())
	if err != nil || len(changed) != 0 || len(again.Roles[policy.RoleWorker].AlsoAccepted) != 2 {
		t.Fatalf("accepting twice: changed %q, %d worker alternatives, %v; want nothing changed", changed, len(again.Roles[policy.RoleWorker].AlsoAccepted), err)
	}

	// cp-0 moved, worker-1 did not.
	half := []nodevalues.Proof{{Node: "cp-0", Measured: measured(imageV2CP)}, {Node: "worker-1", Measured: measured(imageV1Worker)}, {Node: "ns-1", Measured: measured(nsWorker)}}
	p2, rep, err := nodevalues.Retire(accepted, imageV2(), half)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Retired) != 1 || !strings.HasPrefix(rep.Retired[0], "roles.controlPlane.referenceValues ") {
		t.Errorf("retired %q, want the control plane's v1 set only", rep.Retired)
	}
	if got := slices.Collect(maps.Keys(rep.Pending)); len(got) != 1 || !strings.HasPrefix(got[0], "roles.worker.referenceValues ") || !slices.Equal(rep.Pending[got[0]], []string{"worker-1"}) {
		t.Errorf("pending %v, want the worker's v1 set, kept for worker-1", rep.Pending)
	}
	if got := roles(t, p2, imageV1Worker); !slices.Equal(got, []policy.Role{policy.RoleWorker}) {
		t.Errorf("a v1 worker, still running: roles %v, want worker", got)
	}
	if got := roles(t, p2, imageV1CP); got != nil {
		t.Errorf("a v1 control plane after its set was retired: roles %v, want none", got)
	}

	// worker-1 was replaced by a v2 worker, and ns-1 left: no node proves
	// the namespace kind's set, which v2 (over other PCRs) does not replace.
	all := []nodevalues.Proof{{Node: "cp-0", Measured: measured(imageV2CP)}, {Node: "worker-2", Measured: measured(imageV2Worker)}}
	done, rep, err := nodevalues.Retire(p2, imageV2(), all)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Retired) != 1 || !strings.HasPrefix(rep.Retired[0], "roles.worker.referenceValues ") || len(rep.Pending) != 0 {
		t.Errorf("retired %q, pending %v; want the worker's v1 set retired, nothing pending", rep.Retired, rep.Pending)
	}
	for _, tt := range []struct {
		name string
		m    map[uint32]byte
		want []policy.Role
	}{
		{"v1 worker", imageV1Worker, nil},
		{"v1 control plane", imageV1CP, nil},
		{"v2 worker", imageV2Worker, []policy.Role{policy.RoleWorker}},
		{"v2 control plane", imageV2CP, []policy.Role{policy.RoleControlPlane}},
		{"namespace worker (another kind of node, kept)", nsWorker, []policy.Role{policy.RoleWorker}},
	} {
		if got := roles(t, done, tt.m); !slices.Equal(got, tt.want) {
			t.Errorf("after the move, %s: roles %v, want %v", tt.name, got, tt.want)
		}
	}
	if want := raw(t, imageV2CP); !bytes.Equal(done.Roles[policy.RoleControlPlane].ReferenceValues, want) || done.Roles[policy.RoleControlPlane].AlsoAccepted != nil {
		t.Errorf("the control plane's sets after the move: %s %s, want v2 as referenceValues alone", done.Roles[policy.RoleControlPlane].ReferenceValues, done.Roles[policy.RoleControlPlane].AlsoAccepted)
	}
	// Retiring again changes nothing.
	if _, rep, err := nodevalues.Retire(done, imageV2(), all); err != nil || len(rep.Retired) != 0 {
		t.Errorf("retiring twice: retired %q, %v", rep.Retired, err)
	}
}

// TestAcceptCommonValues: a policy with common referenceValues (as
// `gatehouse config generate` writes from signed values: what both roles
// share) has them moved into each role's sets, so a v2 node is not held to
// v1's common PCR, the policy admits what it did before besides v2, and
// the v1 sets are retired once no node proves them (whole sets compared).
func TestAcceptCommonValues(t *testing.T) {
	with8 := func(m map[uint32]byte, b byte) map[uint32]byte {
		out := maps.Clone(m)
		out[8] = b
		return out
	}
	for _, tt := range []struct {
		name   string
		v2PCR8 byte
	}{
		{"v2 changes the common PCR", 0x82},
		{"v2 repeats the common PCR", 0x81},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := basePolicy(t)
			p.ReferenceValues = raw(t, map[uint32]byte{8: 0x81})
			p.Roles[policy.RoleWorker] = policy.RolePolicy{ReferenceValues: raw(t, imageV1Worker)}
			v := imageV2()
			v.Roles = map[policy.Role]measurements.M{policy.RoleControlPlane: values(with8(imageV2CP, tt.v2PCR8)), policy.RoleWorker: values(with8(imageV2Worker, tt.v2PCR8))}
			accepted, _, err := nodevalues.Accept(p, v)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				name string
				m    map[uint32]byte
				want []policy.Role
			}{
				{"v1 worker with the common PCR 8", with8(imageV1Worker, 0x81), []policy.Role{policy.RoleWorker}},
				{"v1 worker without it", with8(imageV1Worker, 0x99), nil},
				{"v2 worker", with8(imageV2Worker, tt.v2PCR8), []policy.Role{policy.RoleWorker}},
				{"v2 worker, another PCR 8", with8(imageV2Worker, 0x99), nil},
			} {
				if got := roles(t, accepted, c.m); !slices.Equal(got, c.want) {
					t.Errorf("%s: roles %v, want %v", c.name, got, c.want)
				}
			}
			proofs := []nodevalues.Proof{{Node: "cp", Measured: measured(with8(imageV2CP, tt.v2PCR8))}, {Node: "w", Measured: measured(with8(imageV2Worker, tt.v2PCR8))}}
			done, rep, err := nodevalues.Retire(accepted, v, proofs)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Retired) != 2 {
				t.Errorf("retired %q, want both roles' v1 sets", rep.Retired)
			}
			if got := roles(t, done, with8(imageV1Worker, 0x81)); got != nil {
				t.Errorf("a v1 worker after the move: roles %v, want none", got)
			}
		})
	}
}

// TestRefusals: what Accept and Retire refuse, each naming what is wrong;
// the caller's policy is unchanged.
func TestRefusals(t *testing.T) {
	for _, tt := range []struct {
		name    string
		edit    func(*policy.Policy, *signedvalues.Values)
		retire  bool
		wantErr string
	}{
		{"a role the policy lacks", func(p *policy.Policy, _ *signedvalues.Values) { delete(p.Roles, policy.RoleWorker) }, false, "which the policy does not have (roles.worker)"},
		{"a PCR the nodes do not quote", func(_ *policy.Policy, v *signedvalues.Values) {
			v.Roles[policy.RoleWorker] = values(map[uint32]byte{4: 0x42, 9: 0x99})
		}, false, "set PCR 9, which the nodes do not quote"},
		{"a worker set equal to a control plane's", func(_ *policy.Policy, v *signedvalues.Values) {
			v.Roles[policy.RoleWorker] = values(imageV1CP)
		}, false, "must expect different values"},
		{"no roles", func(_ *policy.Policy, v *signedvalues.Values) { v.Roles = nil }, false, "no roles"},
		{"retiring values never accepted", func(*policy.Policy, *signedvalues.Values) {}, true, "not accepted by the policy: accept them first"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, v := basePolicy(t), imageV2()
			tt.edit(&p, &v)
			before, _ := json.Marshal(p)
			var err error
			if tt.retire {
				_, _, err = nodevalues.Retire(p, v, nil)
			} else {
				_, _, err = nodevalues.Accept(p, v)
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			if after, _ := json.Marshal(p); !bytes.Equal(before, after) {
				t.Errorf("the caller's policy changed")
			}
		})
	}
}
