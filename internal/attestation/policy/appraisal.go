package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/measurements"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
)

// Role names what a node may be in the cluster. A node gets a role only
// when its evidence satisfies that role's reference values: the role is
// part of what the node measures at boot (a role-specific image, or the
// role on the measured kernel command line), never a request field
// (docs/joinservice.md, "Roles from evidence").
type Role string

// The roles a join policy can grant.
const (
	// RoleControlPlane may receive the cluster's CA material and join with
	// `kubeadm join --control-plane`.
	RoleControlPlane Role = "controlPlane"
	// RoleWorker may join as a worker.
	RoleWorker Role = "worker"
)

// knownRoles lists the roles in the order they are reported.
var knownRoles = []Role{RoleControlPlane, RoleWorker}

// RolePolicy is what evidence must show to get a role.
type RolePolicy struct {
	// ReferenceValues are the role's expected PCR values (package
	// measurements' format), checked besides the policy's common ones.
	ReferenceValues json.RawMessage `json:"referenceValues"`
	// AlsoAccepted are other sets of the role's expected PCR values
	// (same format), each accepted instead of ReferenceValues: the
	// values of a second node image (a local cluster's VM nodes beside
	// its namespace nodes) or of the next software version during a roll.
	// Evidence gets the role when it satisfies ReferenceValues or any of
	// these; each set is checked as ReferenceValues is (its PCRs
	// selected, the control-plane role's sets exclusive with every other
	// role's).
	AlsoAccepted []json.RawMessage `json:"alsoAccepted,omitempty"`
}

// Appraisal is a compiled Policy: it verifies evidence (as an
// attestation.Verifier, accepting evidence that satisfies at least one
// role) and tells which roles verified measurements satisfy. It is safe for
// concurrent use.
type Appraisal struct {
	common attestation.Verifier
	roles  map[Role][]measurements.M // each role's accepted sets, ReferenceValues first
	// ID names this policy version: "sha256:" and the hex SHA-256 of the
	// policy's canonical JSON. Results it accepts carry it as
	// attestation.Result.AppraisalPolicy, so a relying party can tell
	// whether a result was appraised under the policy in force now.
	ID string
	// Summary describes the policy for logs: variant, PCRs, a digest of
	// the reference values and the roles.
	Summary string
}

// Appraisal compiles p. lockPCR is what the node-lock PCR must hold: nil
// means zero, a node that has not taken its node lock, which is what
// key-issuing endpoints require; a verifier of a running node passes the
// value its cluster ID extended into it. Errors name the field that is
// wrong.
func (p Policy) Appraisal(now func() time.Time, lockPCR []byte) (*Appraisal, error) {
	variant, err := attestation.ParseVariant(p.Variant)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(p.PCRs, keys.NodeLockPCR) {
		return nil, fmt.Errorf("pcrs must include the node-lock PCR %d", keys.NodeLockPCR)
	}
	ref, err := parseReferenceValues("referenceValues", p.ReferenceValues, p.PCRs, true)
	if err != nil {
		return nil, err
	}
	roles, err := parseRoles(p.Roles, p.PCRs)
	if err != nil {
		return nil, err
	}
	if lockPCR == nil {
		lockPCR = make([]byte, 32)
	}
	ref[keys.NodeLockPCR] = measurements.Measurement{Expected: lockPCR}
	requireEventLog := p.requiresEventLog(append(slices.Concat(slices.Collect(maps.Values(roles))...), ref)...)
	v, err := p.commonVerifier(variant, ref, now, requireEventLog)
	if err != nil {
		return nil, err
	}
	canonical, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(append(canonical, lockPCR...))
	refJSON, err := ref.Marshal()
	if err != nil {
		return nil, err
	}
	a := &Appraisal{common: v, roles: roles, ID: "sha256:" + hex.EncodeToString(sum[:])}
	var roleSummary []string
	for _, r := range knownRoles {
		var prints []string
		for _, m := range roles[r] {
			j, err := m.Marshal()
			if err != nil {
				return nil, err
			}
			prints = append(prints, Fingerprint(j))
		}
		if len(prints) > 0 {
			roleSummary = append(roleSummary, string(r)+"="+strings.Join(prints, "|"))
		}
	}
	a.Summary = fmt.Sprintf("variant=%s pcrs=%v referenceValues=%s roles=[%s] keys=%s requireEventLog=%t", variant, p.PCRs, Fingerprint(refJSON), strings.Join(roleSummary, " "), p.keyTrust(), requireEventLog)
	return a, nil
}

// parseReferenceValues parses one reference value set; each index must be
// in pcrs and not the node-lock PCR.
func parseReferenceValues(field string, raw json.RawMessage, pcrs []int, mayBeEmpty bool) (measurements.M, error) {
	var probe map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &probe) == nil && len(probe) == 0 {
		if !mayBeEmpty {
			return nil, fmt.Errorf("%s is empty: a role without reference values is granted to any software", field)
		}
		return measurements.M{}, nil
	}
	ref, err := measurements.Parse(raw, 32)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	for index := range ref {
		if index == keys.NodeLockPCR {
			return nil, fmt.Errorf("%s must not set PCR %d: it holds the node lock, always checked", field, keys.NodeLockPCR)
		}
		if !slices.Contains(pcrs, int(index)) {
			return nil, fmt.Errorf("%s sets PCR %d, which pcrs does not select", field, index)
		}
	}
	return ref, nil
}

// parseRoles checks the roles: known names, reference values each, and a
// control-plane role that no other role's evidence can satisfy.
func parseRoles(in map[Role]RolePolicy, pcrs []int) (map[Role][]measurements.M, error) {
	if len(in) == 0 {
		return nil, fmt.Errorf("roles is empty: set the reference values of roles.%s and/or roles.%s (docs/joinservice.md, \"Roles from evidence\")", RoleControlPlane, RoleWorker)
	}
	roles := make(map[Role][]measurements.M, len(in))
	for _, name := range slices.Sorted(maps.Keys(in)) {
		if !slices.Contains(knownRoles, name) {
			return nil, fmt.Errorf("roles.%s: unknown role; known roles are %s, %s", name, RoleControlPlane, RoleWorker)
		}
		ref, err := parseReferenceValues("roles."+string(name)+".referenceValues", in[name].ReferenceValues, pcrs, false)
		if err != nil {
			return nil, err
		}
		roles[name] = []measurements.M{ref}
		for i, raw := range in[name].AlsoAccepted {
			ref, err := parseReferenceValues(fmt.Sprintf("roles.%s.alsoAccepted[%d]", name, i), raw, pcrs, false)
			if err != nil {
				return nil, err
			}
			roles[name] = append(roles[name], ref)
		}
	}
	for name, others := range roles {
		if name == RoleControlPlane {
			continue
		}
		for i, cp := range roles[RoleControlPlane] {
			for j, other := range others {
				if !exclusive(cp, other) {
					return nil, fmt.Errorf("%s and %s must expect different values for at least one PCR that neither marks warnOnly; otherwise a %s's evidence can satisfy the control-plane role",
						roleField(RoleControlPlane, i), roleField(name, j), name)
				}
			}
		}
	}
	return roles, nil
}

// roleField names set i of role's accepted reference values in the
// policy file: its referenceValues (0) or alsoAccepted[i-1].
func roleField(role Role, i int) string {
	if i == 0 {
		return "roles." + string(role) + ".referenceValues"
	}
	return fmt.Sprintf("roles.%s.alsoAccepted[%d]", role, i-1)
}

// satisfies compares measured with each of role's accepted sets and
// returns the warnings of the first it satisfies, or, when none is
// satisfied, each set's mismatch (with the events behind it, from the
// result's TCG event log) as one error.
func (a *Appraisal) satisfies(role Role, result *attestation.Result) ([]measurements.Mismatch, error) {
	sets := a.roles[role]
	var misses []string
	for i, ref := range sets {
		warnings, err := ref.Compare(result.Measurements)
		if err == nil {
			return warnings, nil
		}
		what := err.Error() + explain(ref, result)
		if len(sets) > 1 {
			what = roleField(role, i) + ": " + what
		}
		misses = append(misses, what)
	}
	return nil, errors.New(strings.Join(misses, "; "))
}

// exclusive reports whether no measurements can satisfy both a and b: they
// enforce disjoint sets of values at some index.
func exclusive(a, b measurements.M) bool {
	for index, ma := range a {
		if mb, ok := b[index]; ok && !ma.WarnOnly && !mb.WarnOnly && !slices.ContainsFunc(ma.Values(), mb.Accepts) {
			return true
		}
	}
	return false
}

// Variant returns the policy's attestation variant.
func (a *Appraisal) Variant() attestation.Variant { return a.common.Variant() }

// Verify checks evidence against the policy: every check of the variant's
// verifier with the common reference values, and the reference values of
// at least one role. The result's AppraisalPolicy is a.ID; its warnings
// include those of the roles it satisfies. A node satisfying no role gets
// an error wrapping attestation.ErrMeasurement that lists each role's
// mismatches.
func (a *Appraisal) Verify(ctx context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	result, err := a.common.Verify(ctx, evidence, nonce)
	if err != nil {
		return nil, err
	}
	var misses []string
	satisfied := false
	for _, r := range knownRoles {
		if _, ok := a.roles[r]; !ok {
			continue
		}
		warnings, err := a.satisfies(r, result)
		if err != nil {
			misses = append(misses, fmt.Sprintf("role %s: %v", r, err))
			continue
		}
		satisfied = true
		for _, w := range warnings {
			result.Warnings = append(result.Warnings, fmt.Sprintf("role %s: PCR %s", r, w))
		}
	}
	if !satisfied {
		return nil, fmt.Errorf("%w: the evidence satisfies no role: %s", attestation.ErrMeasurement, strings.Join(misses, "; "))
	}
	result.AppraisalPolicy = a.ID
	return result, nil
}

// Roles returns the roles whose reference values measured satisfies, in a
// fixed order (control plane first). Measurements come from a result this
// appraisal (or an earlier version) verified.
func (a *Appraisal) Roles(measured map[uint32][]byte) []Role {
	var out []Role
	result := &attestation.Result{Measurements: measured}
	for _, r := range knownRoles {
		if _, ok := a.roles[r]; ok {
			if _, err := a.satisfies(r, result); err == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// errRoleNotAttested means verified evidence does not satisfy the reference
// values of the role asked for.
var errRoleNotAttested = errors.New("the evidence does not satisfy the role's reference values")

// ForRole returns a verifier that accepts only evidence satisfying role
// (for the CLI, which knows the role of the node it verifies). Its errors
// wrap attestation.ErrMeasurement.
func (a *Appraisal) ForRole(role Role) (attestation.Verifier, error) {
	if _, ok := a.roles[role]; !ok {
		return nil, fmt.Errorf("the policy has no role %s; set roles.%s.referenceValues", role, role)
	}
	return &roleVerifier{a: a, role: role}, nil
}

type roleVerifier struct {
	a    *Appraisal
	role Role
}

func (v *roleVerifier) Variant() attestation.Variant { return v.a.Variant() }

func (v *roleVerifier) Verify(ctx context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	result, err := v.a.Verify(ctx, evidence, nonce)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(v.a.Roles(result.Measurements), v.role) {
		_, cmpErr := v.a.satisfies(v.role, result)
		return nil, fmt.Errorf("%w: %w: role %s: %w", attestation.ErrMeasurement, errRoleNotAttested, v.role, cmpErr)
	}
	return result, nil
}

// explain names, from the TCG event log a verified result carries, the
// events behind the PCRs that differ from ref (tpm.ExplainMismatches), as
// the end of a refusal's message; "" without a log.
func explain(ref measurements.M, result *attestation.Result) string {
	return tpm.ExplanationSuffix(tpm.ExplainMismatches(ref, result.Measurements, result.BootEvents))
}
