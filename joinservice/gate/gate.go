// Package gate is the one decision every node credential passes: join
// tickets, rejoin tickets, first kubelet client certificates and kubelet
// certificate renewals (docs/continuous-attestation.md, "One gate"). It
// refuses a node that is denied by any identity its evidence proves, whose
// fresh evidence does not verify, that an administrator must restore
// first, or that is tainted; it reads the node's authoritative attestation
// record (internal/nodeattestation), never what the node says of itself.
package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/joinservice/joinconfig"
)

// Kind is the credential a node asks for.
type Kind string

// The credentials the gate decides.
const (
	// Join: a join ticket (IssueJoinTicket): disk key, bootstrap token,
	// kubelet serving certificate.
	Join Kind = "join"
	// Rejoin: a rejoin ticket (IssueRejoinTicket): the disk key, and a
	// bootstrap token when the node renews expired kubelet credentials.
	Rejoin Kind = "rejoin"
	// FirstCertificate: a kubelet's first client certificate, requested
	// with a bootstrap token.
	FirstCertificate Kind = "first-certificate"
	// Renewal: a kubelet client or serving certificate requested with the
	// node's own credentials.
	Renewal Kind = "renewal"
)

// Reasons of a refusal, besides the fresh evidence's own (Evidence.Failure).
const (
	// ReasonDenied: the deny list names an identity the evidence proves,
	// or the node name.
	ReasonDenied = "Denied"
	// ReasonAwaitingRestore: the node failed under `restore: admin`, and
	// no administrator has restored it (`gatehouse node restore`).
	ReasonAwaitingRestore = "AwaitingRestore"
	// ReasonTainted: the node is tainted gatehouse.dev/unattested; it
	// must prove itself again first.
	ReasonTainted = "Unattested"
	// ReasonNotAttested: no fresh evidence was given for a credential
	// that needs it.
	ReasonNotAttested = "NotAttested"
)

// TaintKey is the taint continuous attestation puts on a node that stopped
// proving itself.
const TaintKey = "gatehouse.dev/unattested"

// Evidence is what the node's fresh evidence proved, or why it proved
// nothing.
type Evidence struct {
	// Identities are every identity the verified evidence proves
	// (attestation.Result.Identities); empty when it did not verify.
	Identities []string
	// Failure is the reason the evidence did not verify (a condition
	// reason such as EvidenceRejected, Unreachable, IdentityChanged), ""
	// when it verified; Message says what differed. Never a secret.
	Failure, Message string
}

// Request asks for one credential for one node.
type Request struct {
	Kind Kind
	// Node is the node name the credential is for.
	Node string
	// Evidence is the verdict on the node's fresh evidence. Nil only for a
	// first certificate requested with an administrator's bootstrap token
	// (kubeadm token create), which names no node and proves nothing: the
	// administrator vouched for the machine; the record, the taint and the
	// node-name deny entries still apply.
	Evidence *Evidence
}

// Refusal is the gate's no: a reason (for audit logs, metrics and
// conditions) and a message for the caller. It never holds a secret.
type Refusal struct {
	Reason  string
	Message string
}

func (r *Refusal) Error() string { return r.Message }

// policySource is the live deny list and settings (*joinservice.PolicyStore).
type policySource interface {
	Current() (*joinconfig.JoinConfig, *joinconfig.DenyList, error)
}

// recordSource reads the authoritative records (*nodeattestation.Cache).
type recordSource interface {
	Get(node string) (nodeattestation.Record, error)
}

// nodeSource reads Nodes (continuous.NodeCache, from an informer's cache).
type nodeSource interface {
	Get(name string) (*corev1.Node, error)
}

// Gate decides node credentials. It is safe for concurrent use.
type Gate struct {
	policy    policySource
	records   recordSource
	nodes     nodeSource
	log       *slog.Logger
	decisions *prometheus.CounterVec
}

// New returns the gate over the live policy, the records and the Nodes;
// gatehouse_gate_decisions_total{kind,result} is registered with reg.
func New(policy policySource, records recordSource, nodes nodeSource, log *slog.Logger, reg prometheus.Registerer) (*Gate, error) {
	if policy == nil || records == nil || nodes == nil || log == nil || reg == nil {
		return nil, errors.New("credential gate: policy, records, nodes, log and registerer are required")
	}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "gatehouse", Subsystem: "gate", Name: "decisions_total",
		Help: "Node credential decisions of the one gate, by credential kind and result (allowed, or the refusal's reason).",
	}, []string{"kind", "result"})
	if err := reg.Register(decisions); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	return &Gate{policy: policy, records: records, nodes: nodes, log: log, decisions: decisions}, nil
}

// Decide returns nil when req's node may have the credential, else the
// refusal; it audits and counts both. In order, it refuses: a node denied
// by any identity its evidence proves or by its name (Denied); fresh
// evidence that did not verify (its own reason); a node awaiting an
// administrator's restore (AwaitingRestore); a tainted node (Unattested:
// its record or its Node says so), except a rejoin under `restore:
// automatic`, whose disk key lets the rebooted machine run and prove
// itself again (its kubelet's certificates pass the gate again). It
// returns an error, and decides nothing, when the policy or the record
// cannot be read (retry).
func (g *Gate) Decide(ctx context.Context, req Request) (*Refusal, error) {
	refusal, err := g.decide(req)
	if err != nil {
		return nil, err
	}
	result, level := "allowed", slog.LevelInfo
	attrs := []any{"event", "gate.decision", "kind", string(req.Kind), "node", req.Node}
	if req.Evidence != nil {
		attrs = append(attrs, "identities", req.Evidence.Identities)
	}
	if refusal != nil {
		result, level = refusal.Reason, slog.LevelWarn
		attrs = append(attrs, "message", refusal.Message)
	}
	g.decisions.WithLabelValues(string(req.Kind), result).Inc()
	g.log.Log(ctx, level, "audit", append(attrs, "result", result)...)
	return refusal, nil
}

func (g *Gate) decide(req Request) (*Refusal, error) {
	join, deny, err := g.policy.Current()
	if err != nil {
		return nil, fmt.Errorf("credential gate: no policy yet: %w", err)
	}
	var identities []string
	if req.Evidence != nil {
		identities = req.Evidence.Identities
	}
	if entry, denied := deniedEntry(deny, identities, req.Node); denied {
		return &Refusal{ReasonDenied, fmt.Sprintf("denied by the cluster's deny list (entry %q)", entry)}, nil
	}
	switch {
	case req.Evidence == nil && req.Kind != FirstCertificate:
		return &Refusal{ReasonNotAttested, fmt.Sprintf("a %s needs fresh evidence of node %s", req.Kind, req.Node)}, nil
	case req.Evidence != nil && req.Evidence.Failure != "":
		return &Refusal{req.Evidence.Failure, req.Evidence.Message}, nil
	case req.Evidence != nil && len(req.Evidence.Identities) == 0:
		return &Refusal{ReasonNotAttested, fmt.Sprintf("the fresh evidence of node %s proves no identity", req.Node)}, nil
	}
	rec, err := g.records.Get(req.Node)
	switch {
	case errors.Is(err, nodeattestation.ErrNoRecord):
	case err != nil:
		return nil, fmt.Errorf("credential gate: %w", err)
	case rec.AwaitingRestore:
		return &Refusal{ReasonAwaitingRestore, fmt.Sprintf("node %s failed attestation (%s) under restore: admin; an administrator restores it first (gatehouse node restore %s)",
			req.Node, rec.Reason, req.Node)}, nil
	}
	tainted := rec.Tainted
	node, err := g.nodes.Get(req.Node)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("credential gate: reading Node %s: %w", req.Node, err)
	default:
		tainted = tainted || slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintKey })
	}
	if tainted && (req.Kind != Rejoin || join.ContinuousAttestation.Restore != joinconfig.RestoreAuto) {
		return &Refusal{ReasonTainted, fmt.Sprintf("node %s is tainted %s (%s): it must prove itself again first", req.Node, TaintKey, rec.Reason)}, nil
	}
	return nil, nil
}

// deniedEntry returns the deny-list entry that names one of identities or node,
// if any.
func deniedEntry(deny *joinconfig.DenyList, identities []string, node string) (string, bool) {
	if deny == nil {
		return "", false
	}
	return deny.DeniesAny(identities, node)
}
