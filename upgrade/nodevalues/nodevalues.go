// Package nodevalues moves a join policy's reference values to new node
// software (docs/upgrades.md, "When the node software's measurements
// change"): Accept adds the new software's signed values of each role as
// an accepted set (roles.<role>.alsoAccepted) before any node runs it, and
// Retire removes the sets they replace once no node proves them anymore,
// promoting the new values to the role's referenceValues. Between the
// two, continuous attestation accepts a node running either software and
// still refuses one that measures anything else; after Retire it refuses
// one still running the old software.
//
// A set is replaced by the new values of its role when it covers the
// same PCRs: sets over other PCRs belong to another kind of node (the
// local cluster's namespace nodes beside its VM nodes) and are kept.
package nodevalues

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
)

// valueSize is the size of a PCR value the signed values carry (SHA-256
// PCR banks, package signedvalues).
const valueSize = 32

// Proof is what one node's fresh evidence showed: its verified PCR
// values. The caller verified the evidence (quote, key trust, nonce,
// node lock) under the policy Accept returned.
type Proof struct {
	Node     string
	Measured map[uint32][]byte
}

// Report says what Retire did.
type Report struct {
	// Retired names each set removed, as its policy field before the
	// change with its fingerprint (policy.Fingerprint).
	Retired []string
	// Pending maps a replaced set that some node still proves (its field
	// and fingerprint) to those nodes, sorted: the set stays until they
	// moved.
	Pending map[string][]string
}

// Accept returns p with v's values of each role accepted: appended to the
// role's alsoAccepted unless the role already accepts exactly them. It
// returns what it changed (empty when nothing: Accept is idempotent).
//
// When p has common referenceValues (a policy `gatehouse config
// generate` made from signed values keeps what both roles share there),
// they are moved into each of the roles' existing sets first and emptied
// (the same policy: common ∧ (A ∨ B) = (common ∧ A) ∨ (common ∧ B)):
// every set then stands alone, so the new sets are not held to the old
// common values and Retire compares whole sets.
//
// Errors: a role of v that p has no roles.<role> for, a PCR of v that p
// does not quote, a set whose own values contradict the common ones, and
// a result that does not compile (e.g. a new control-plane set that a
// worker's values could satisfy).
func Accept(p policy.Policy, v signedvalues.Values) (policy.Policy, []string, error) {
	p = clone(p)
	if len(v.Roles) == 0 {
		return p, nil, errors.New("the new reference values have no roles")
	}
	common, err := parseSet("referenceValues", p.ReferenceValues)
	if err != nil {
		return p, nil, err
	}
	var changed []string
	roles := slices.Sorted(maps.Keys(v.Roles))
	if len(common) > 0 {
		for _, r := range slices.Sorted(maps.Keys(p.Roles)) {
			if err := foldCommon(&p, r, common); err != nil {
				return p, nil, err
			}
		}
		p.ReferenceValues = json.RawMessage("{}")
		changed = append(changed, "referenceValues moved into each role's sets, which now stand alone")
	}
	for _, r := range roles {
		rp, ok := p.Roles[r]
		if !ok {
			return p, nil, fmt.Errorf("the new reference values have role %s, which the policy does not have (roles.%s): add the role to the cluster's policy first", r, r)
		}
		m := v.Roles[r]
		for _, i := range m.Indices() {
			if !slices.Contains(p.PCRs, int(i)) {
				return p, nil, fmt.Errorf("the new %s values set PCR %d, which the nodes do not quote (pcrs %v)", r, i, p.PCRs)
			}
		}
		raw, err := encode(m)
		if err != nil {
			return p, nil, err
		}
		sets, err := roleSets(r, rp)
		if err != nil {
			return p, nil, err
		}
		if slices.ContainsFunc(sets, func(s set) bool { return bytes.Equal(s.canonical, raw) }) {
			continue
		}
		rp.AlsoAccepted = append(rp.AlsoAccepted, raw)
		p.Roles[r] = rp
		changed = append(changed, fmt.Sprintf("roles.%s.alsoAccepted[%d] = the new values %s", r, len(rp.AlsoAccepted)-1, policy.Fingerprint(raw)))
	}
	if _, err := p.Appraisal(time.Now, nil); err != nil {
		return p, nil, fmt.Errorf("the policy with the new values: %w", err)
	}
	return p, changed, nil
}

// Retire returns p without the sets v's values replace (each role's sets
// over the same PCRs as v's, other than v's) that no proof satisfies, v's
// set taking the role's referenceValues when that was retired. Every
// node's proof must be in proofs: a node missing would keep no set alive.
// v's values must be accepted already (Accept).
func Retire(p policy.Policy, v signedvalues.Values, proofs []Proof) (policy.Policy, Report, error) {
	p = clone(p)
	rep := Report{Pending: map[string][]string{}}
	for _, r := range slices.Sorted(maps.Keys(v.Roles)) {
		rp, ok := p.Roles[r]
		if !ok {
			return p, rep, fmt.Errorf("the policy has no role %s (roles.%s)", r, r)
		}
		newRaw, err := encode(v.Roles[r])
		if err != nil {
			return p, rep, err
		}
		sets, err := roleSets(r, rp)
		if err != nil {
			return p, rep, err
		}
		if !slices.ContainsFunc(sets, func(s set) bool { return bytes.Equal(s.canonical, newRaw) }) {
			return p, rep, fmt.Errorf("the new %s values are not accepted by the policy: accept them first", r)
		}
		newIndices := v.Roles[r].Indices()
		var kept []json.RawMessage
		for _, s := range sets {
			replaced := !bytes.Equal(s.canonical, newRaw) && slices.Equal(s.m.Indices(), newIndices)
			if !replaced {
				kept = append(kept, s.raw)
				continue
			}
			var provers []string
			for _, pr := range proofs {
				if _, err := s.m.Compare(pr.Measured); err == nil {
					provers = append(provers, pr.Node)
				}
			}
			name := s.field + " " + policy.Fingerprint(s.canonical)
			if len(provers) > 0 {
				slices.Sort(provers)
				rep.Pending[name] = provers
				kept = append(kept, s.raw)
				continue
			}
			rep.Retired = append(rep.Retired, name)
		}
		rp.ReferenceValues, rp.AlsoAccepted = kept[0], kept[1:]
		if len(rp.AlsoAccepted) == 0 {
			rp.AlsoAccepted = nil
		}
		p.Roles[r] = rp
	}
	if _, err := p.Appraisal(time.Now, nil); err != nil {
		return p, rep, fmt.Errorf("the policy without the retired values: %w", err)
	}
	return p, rep, nil
}

// set is one accepted set of a role.
type set struct {
	field     string
	raw       json.RawMessage
	canonical []byte
	m         measurements.M
}

// roleSets returns rp's sets, referenceValues first.
func roleSets(r policy.Role, rp policy.RolePolicy) ([]set, error) {
	var out []set
	for i, raw := range append([]json.RawMessage{rp.ReferenceValues}, rp.AlsoAccepted...) {
		field := fmt.Sprintf("roles.%s.referenceValues", r)
		if i > 0 {
			field = fmt.Sprintf("roles.%s.alsoAccepted[%d]", r, i-1)
		}
		m, err := parseSet(field, raw)
		if err != nil {
			return nil, err
		}
		canonical, err := encode(m)
		if err != nil {
			return nil, err
		}
		out = append(out, set{field: field, raw: raw, canonical: canonical, m: m})
	}
	return out, nil
}

// parseSet parses one set of reference values; empty (absent, null or
// {}, as a local cluster with VM nodes has the common values) is no
// values.
func parseSet(field string, raw json.RawMessage) (measurements.M, error) {
	var probe map[string]json.RawMessage
	if len(bytes.TrimSpace(raw)) == 0 || json.Unmarshal(raw, &probe) == nil && len(probe) == 0 {
		return measurements.M{}, nil
	}
	m, err := measurements.Parse(raw, valueSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return m, nil
}

// encode is m as one line of JSON, the form a policy holds sets in; the
// same values always encode to the same bytes.
func encode(m measurements.M) (json.RawMessage, error) {
	y, err := m.Marshal()
	if err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return json.RawMessage("{}"), nil
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(j), nil
}

// sameValues compares what two measurements accept and enforce.
func sameValues(a, b measurements.Measurement) bool {
	return a.WarnOnly == b.WarnOnly && bytes.Equal(a.Expected, b.Expected) &&
		slices.EqualFunc(a.AlsoAccepted, b.AlsoAccepted, bytes.Equal)
}

// foldCommon adds common to each set of role r in p.
func foldCommon(p *policy.Policy, r policy.Role, common measurements.M) error {
	rp := p.Roles[r]
	sets, err := roleSets(r, rp)
	if err != nil {
		return err
	}
	var out []json.RawMessage
	for _, s := range sets {
		for i, c := range common {
			if own, ok := s.m[i]; ok && !sameValues(own, c) {
				return fmt.Errorf("%s sets PCR %d unlike referenceValues: no evidence satisfies both; fix the policy first", s.field, i)
			}
			s.m[i] = c
		}
		raw, err := encode(s.m)
		if err != nil {
			return err
		}
		out = append(out, raw)
	}
	rp.ReferenceValues, rp.AlsoAccepted = out[0], out[1:]
	if len(rp.AlsoAccepted) == 0 {
		rp.AlsoAccepted = nil
	}
	p.Roles[r] = rp
	return nil
}

// clone copies p's roles, so that changing them leaves the caller's
// policy as it was.
func clone(p policy.Policy) policy.Policy {
	roles := make(map[policy.Role]policy.RolePolicy, len(p.Roles))
	for r, rp := range p.Roles {
		rp.AlsoAccepted = slices.Clone(rp.AlsoAccepted)
		roles[r] = rp
	}
	p.Roles = roles
	return p
}
