// Package continuous is continuous attestation: on an interval it asks every
// Node for fresh evidence (its evidence endpoint, attested TLS with a fresh
// nonce), verifies it with the join service's current policy as a join is
// verified (reference values, roles, deny list), checks that the node is
// still the machine that joined under its name (its name binding), and
// records the outcome as the Node condition gatehouse.dev/Attested
// (docs/continuous-attestation.md).
package continuous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gatehouse-dev/gatehouse/internal/atls"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterpki"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// ConditionType is the Node condition continuous attestation keeps.
const ConditionType corev1.NodeConditionType = "gatehouse.dev/Attested"

// Reasons of the condition: Verified when it is True, else why not.
const (
	ReasonVerified = "Verified"
	// ReasonEvidenceRejected: the evidence does not verify against the
	// current reference values (the message names what differed).
	ReasonEvidenceRejected = "EvidenceRejected"
	// ReasonIdentityChanged: the evidence verifies, but from another
	// machine than the one the node name is bound to.
	ReasonIdentityChanged = "IdentityChanged"
	// ReasonNotBound: no machine is bound to the node name.
	ReasonNotBound = "NotBound"
	// ReasonDenied: the deny list names the machine or the node.
	ReasonDenied = "Denied"
	// ReasonRoleNotAttested: a control-plane Node whose evidence does not
	// prove the control-plane role.
	ReasonRoleNotAttested = "RoleNotAttested"
	// ReasonUnreachable: no evidence could be fetched.
	ReasonUnreachable = "Unreachable"
	// ReasonRebooting: the machine answers with evidence a joining node
	// would send (node-lock PCR zero): it rebooted and has not rejoined
	// yet. Like Unreachable, it is acted on only after the grace period.
	ReasonRebooting = "Rebooting"
)

// errNotLocked is evidence that satisfies the policy with the node-lock
// PCR still zero.
var errNotLocked = errors.New("the evidence verifies with the node-lock PCR zero: the node rebooted and has not rejoined yet")

// notLockedError is errNotLocked with the identities the evidence proves:
// a rebooting machine must still be the one bound to the name, and not
// denied.
type notLockedError struct {
	identity   string
	identities []string
}

func (e *notLockedError) Error() string { return errNotLocked.Error() }
func (e *notLockedError) Unwrap() error { return errNotLocked }

// runningOrRebooting verifies a running node's evidence, and tells a
// rebooted node that has not taken its node lock yet (errNotLocked) from
// evidence that fails the policy.
type runningOrRebooting struct {
	running, joining *policy.Appraisal
}

func (v runningOrRebooting) Variant() attestation.Variant { return v.running.Variant() }

func (v runningOrRebooting) Verify(ctx context.Context, evidence, nonce []byte) (*attestation.Result, error) {
	r, err := v.running.Verify(ctx, evidence, nonce)
	if err == nil || !errors.Is(err, attestation.ErrMeasurement) {
		return r, err
	}
	if joined, jerr := v.joining.Verify(ctx, evidence, nonce); jerr == nil {
		return nil, fmt.Errorf("%w: %w", attestation.ErrPolicy, &notLockedError{identity: joined.Identity, identities: joined.Identities()})
	}
	return nil, err
}

// labelControlPlane marks control-plane Nodes (kubeadm).
const labelControlPlane = "node-role.kubernetes.io/control-plane"

// Outcome is one node's verification.
type Outcome struct {
	Node     string
	Attested bool
	Reason   string
	// Message says what differed or failed; never a secret.
	Message string
	// Identity is the attestation identity the evidence came from, when it verified.
	Identity string
	// Identities are every identity the evidence proves
	// (attestation.Result.Identities), Identity first, when it verified:
	// the deny list and the credential gate match them all.
	Identities []string
	// Address is where the verified evidence was fetched: an address the
	// machine answers at (attested TLS), when it verified.
	Address netip.Addr
}

// policySource is the join service's live policy (*joinservice.PolicyStore).
type policySource interface {
	Current() (*joinconfig.JoinConfig, *joinconfig.DenyList, error)
}

// identitySource returns the identity a node name is bound to
// (*joinservice.NodeBindings).
type identitySource interface {
	Identity(ctx context.Context, node string) (string, error)
}

// FetchFunc fetches a node's evidence at addr and verifies it with
// verifiers (atls.FetchEvidence).
type FetchFunc func(ctx context.Context, addr string, verifiers []attestation.Verifier) (*attestation.Result, error)

// NodeChecker checks running Nodes: it fetches a Node's fresh evidence,
// appraises it with the current policy and checks the machine is the one
// bound to the name (Check). It is safe for concurrent use.
type NodeChecker struct {
	policy   policySource
	bindings identitySource
	fetch    FetchFunc
	// clusterID returns the cluster's ID, which a running node's
	// node-lock PCR holds.
	clusterID func(ctx context.Context) ([]byte, error)
	port      int

	mu        sync.Mutex
	compiled  *joinconfig.JoinConfig // the config appraisal was compiled from
	lockPCR   []byte
	appraisal *policy.Appraisal
}

// NewNodeChecker returns a checker of running nodes: evidence from port of
// each Node's InternalIP, fetched with fetch, appraised with policy's
// current config for the node-lock PCR of clusterID's cluster ID, and the
// identity checked against bindings.
func NewNodeChecker(p policySource, bindings identitySource, fetch FetchFunc, clusterID func(context.Context) ([]byte, error), port int) *NodeChecker {
	return &NodeChecker{policy: p, bindings: bindings, fetch: fetch, clusterID: clusterID, port: port}
}

// errPolicyNotReady means there is no policy to verify with yet: no node
// is judged.
var errPolicyNotReady = errors.New("continuous attestation: no policy to verify with")

// Check verifies node once. It returns an error only when nothing can be
// judged (no policy, no cluster ID); a node that fails is an Outcome.
func (v *NodeChecker) Check(ctx context.Context, node *corev1.Node) (Outcome, error) {
	out := Outcome{Node: node.Name}
	join, deny, err := v.policy.Current()
	if err != nil {
		return out, fmt.Errorf("%w: %w", errPolicyNotReady, err)
	}
	appraisal, err := v.appraisalFor(ctx, join)
	if err != nil {
		return out, err
	}
	addr, err := v.address(node)
	if err != nil {
		out.Reason, out.Message = ReasonUnreachable, err.Error()
		return out, nil
	}
	result, err := v.fetch(ctx, addr, []attestation.Verifier{runningOrRebooting{running: appraisal, joining: join.Appraisal}})
	var notLocked *notLockedError
	switch {
	case err == nil:
	case errors.As(err, &notLocked):
		// The grace a reboot gets is only for the machine that joined.
		out.Identity, out.Identities = notLocked.identity, notLocked.identities
		if o, bad := v.checkMachine(ctx, out, node.Name, deny); bad {
			return o, nil
		}
		out.Reason, out.Message = ReasonRebooting, errNotLocked.Error()
		return out, nil
	case atls.IsRejection(err):
		out.Reason, out.Message = ReasonEvidenceRejected, err.Error()
		return out, nil
	default:
		out.Reason, out.Message = ReasonUnreachable, err.Error()
		return out, nil
	}
	out.Identity, out.Identities = result.Identity, result.Identities()
	if ap, perr := netip.ParseAddrPort(addr); perr == nil {
		out.Address = ap.Addr().Unmap()
	}
	if o, bad := v.checkMachine(ctx, out, node.Name, deny); bad {
		return o, nil
	}
	roles := appraisal.Roles(result.Measurements)
	if len(roles) == 0 {
		out.Reason, out.Message = ReasonEvidenceRejected, "the measurements satisfy no role of the policy"
		return out, nil
	}
	if _, cp := node.Labels[labelControlPlane]; cp && !containsRole(roles, policy.RoleControlPlane) {
		out.Reason, out.Message = ReasonRoleNotAttested, fmt.Sprintf("a control-plane Node whose evidence proves only %v", roles)
		return out, nil
	}
	out.Attested, out.Reason, out.Message = true, ReasonVerified, "fresh evidence verifies against the current policy, from the machine that joined"
	return out, nil
}

// checkMachine checks that out.Identity is the machine bound to node's
// name and that none of out.Identities nor the name is denied; bad
// reports a failed outcome.
func (v *NodeChecker) checkMachine(ctx context.Context, out Outcome, node string, deny *joinconfig.DenyList) (Outcome, bool) {
	bound, err := v.bindings.Identity(ctx, node)
	switch {
	case err != nil:
		out.Reason, out.Message = ReasonNotBound, err.Error()
		return out, true
	case bound != out.Identity:
		out.Reason, out.Message = ReasonIdentityChanged, fmt.Sprintf("the node name is bound to %s; its evidence comes from %s", bound, out.Identity)
		return out, true
	}
	if entry, denied := deny.DeniesAny(out.Identities, node); denied {
		out.Reason, out.Message = ReasonDenied, fmt.Sprintf("denied by the cluster's deny list (entry %q)", entry)
		return out, true
	}
	return out, false
}

// NodeNames returns the names and addresses a node that answered at addr
// owns under the policy in force (joinconfig.JoinConfig.NodeNames).
func (v *NodeChecker) NodeNames(addr netip.Addr) (clusterpki.NodeNames, error) {
	join, _, err := v.policy.Current()
	if err != nil {
		return clusterpki.NodeNames{}, fmt.Errorf("%w: %w", errPolicyNotReady, err)
	}
	return join.NodeNames(addr), nil
}

// Settings returns what the policy in force says to do about failing
// nodes.
func (v *NodeChecker) Settings() (joinconfig.ContinuousAttestation, error) {
	join, _, err := v.policy.Current()
	if err != nil {
		return joinconfig.ContinuousAttestation{}, fmt.Errorf("%w: %w", errPolicyNotReady, err)
	}
	return join.ContinuousAttestation, nil
}

// appraisalFor compiles join's policy for running nodes once per join
// config.
func (v *NodeChecker) appraisalFor(ctx context.Context, join *joinconfig.JoinConfig) (*policy.Appraisal, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.compiled == join && v.appraisal != nil {
		return v.appraisal, nil
	}
	if v.lockPCR == nil {
		id, err := v.clusterID(ctx)
		if err != nil {
			return nil, fmt.Errorf("continuous attestation: the cluster ID: %w", err)
		}
		v.lockPCR = keys.ExpectedNodeLockPCR(id)
	}
	a, err := join.RunningAppraisal(v.lockPCR)
	if err != nil {
		return nil, fmt.Errorf("continuous attestation: compiling the policy for running nodes: %w", err)
	}
	v.compiled, v.appraisal = join, a
	return a, nil
}

// address is node's evidence endpoint: its InternalIP and the port.
func (v *NodeChecker) address(node *corev1.Node) (string, error) {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && net.ParseIP(a.Address) != nil {
			return net.JoinHostPort(a.Address, strconv.Itoa(v.port)), nil
		}
	}
	return "", errors.New("the Node has no InternalIP address")
}

func containsRole(roles []policy.Role, r policy.Role) bool {
	for _, x := range roles {
		if x == r {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// jitter returns d ± 10 %.
func jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1) //nolint:gosec // spreading load, not a secret
}

// logOutcome writes the audit line of a failure or a change.
func logOutcome(log *slog.Logger, o Outcome, changed bool) {
	level := slog.LevelInfo
	if !o.Attested {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "audit", "event", "continuous.result", "node", o.Node, "attested", o.Attested,
		"reason", o.Reason, "message", o.Message, "identity", o.Identity, "changed", changed)
}
