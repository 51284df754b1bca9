package cli

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/attestation"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/keys"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
	"github.com/gatehouse-dev/gatehouse/joinservice/continuous"
)

// verifyReport is verify's JSON output.
type verifyReport struct {
	Node     string `json:"node"`
	Variant  string `json:"variant"`
	Identity string `json:"identity"`
	// Identities are every identity the evidence proves, as deny-list
	// entries (attestation.Result.Identities).
	Identities []string `json:"identities"`
	// Endorsement says how the node's attestation key is trusted
	// (attestation.Result.Endorsement).
	Endorsement string `json:"endorsement,omitempty"`
	// ClusterID is the cluster ID PCR 15 was checked against; empty when
	// the node was expected not to have taken its node lock.
	ClusterID    string            `json:"clusterID,omitempty"`
	Measurements map[string]string `json:"measurements"`
	Warnings     []string          `json:"warnings,omitempty"`
	// Roles are the roles whose reference values the evidence satisfies.
	Roles []policy.Role `json:"roles"`
	// Events are the events of the node's TCG event log, replayed to the
	// quoted PCRs, in log order; absent when the evidence carried none.
	Events []bootEvent `json:"events,omitempty"`
}

// bootEvent is one event of verify's report (attestation.BootEvent).
type bootEvent struct {
	Number      uint32 `json:"number"`
	PCR         uint32 `json:"pcr"`
	Type        string `json:"type"`
	Description string `json:"description,omitempty"`
	Digest      string `json:"digest"`
}

func newVerifyCmd() *cobra.Command {
	var config, node, stateFile, output, kubeconfig, namespace string
	var all, events bool
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Verify a node's attestation and print its measurements",
		Long: "Fetch fresh evidence from a node (its evidence endpoint, or the InitService of a\n" +
			"node not yet initialised) for a new nonce, verify it against the configuration's\n" +
			"policy and print the verified measurements. PCR 15 must hold the cluster ID from\n" +
			"the state file, or zero when there is no state file. When the evidence carries the\n" +
			"node's TCG event log, its events are replayed to the PCRs (--events lists them) and a\n" +
			"refusal names the event behind a PCR that differs. A node that belongs to a cluster\n" +
			"answers only its join service and administrators: verify presents the client certificate\n" +
			"of the admin kubeconfig (--kubeconfig).",
		Example: "  gatehouse verify --node 192.0.2.11:9001\n  gatehouse verify --node 192.0.2.11:9001 --output json\n" +
			"  gatehouse verify --node 192.0.2.11:9001 --kubeconfig gatehouse-admin.conf   # a node that joined a cluster",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("unknown --output %q: use text or json", output)
			}
			if all {
				if node != "" {
					return errors.New("--all and --node exclude each other: --all shows every Node's state from the cluster")
				}
				return printAllNodes(cmd.Context(), cmd.OutOrStdout(), kubeconfig, namespace, output)
			}
			if node == "" {
				return errors.New("--node is required (the node's evidence address, host:port), or --all for every Node's state")
			}
			cfg, err := clusterconfig.Load(config)
			if err != nil {
				return err
			}
			report := verifyReport{Node: node}
			// No state file: a node not initialised yet, whose lock PCR is zero.
			lockPCR, clusterID, err := clusterLockPCR(stateFile)
			switch {
			case err == nil:
				report.ClusterID = clusterID
			case !errors.Is(err, fs.ErrNotExist):
				return err
			}
			appraisal, err := cfg.Appraisal(lockPCR)
			if err != nil {
				return err
			}
			fetcher, err := evidenceFetcher(kubeconfig, cmd.Flags().Changed("kubeconfig"))
			if err != nil {
				return err
			}
			result, err := fetcher.Fetch(cmd.Context(), node, []attestation.Verifier{appraisal})
			if err != nil {
				return refusalError{fetchError(node, kubeconfig, fetcher, err)}
			}
			report.Variant, report.Identity, report.Warnings = string(result.Variant), result.Identity, result.Warnings
			report.Endorsement, report.Identities = result.Endorsement, result.Identities()
			report.Roles = appraisal.Roles(result.Measurements)
			report.Measurements = map[string]string{}
			for i, v := range result.Measurements {
				report.Measurements[fmt.Sprint(i)] = hex.EncodeToString(v)
			}
			for _, e := range result.BootEvents {
				report.Events = append(report.Events, bootEvent{Number: e.Number, PCR: e.PCR, Type: e.Type, Description: e.Description, Digest: hex.EncodeToString(e.Digest)})
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(report)
			}
			return printVerifyReport(cmd.OutOrStdout(), report, result, events)
		},
	}
	f := cmd.Flags()
	f.StringVar(&config, "config", clusterconfig.DefaultPath, "cluster configuration file")
	f.StringVar(&node, "node", "", "the node's evidence address, host:port")
	f.BoolVar(&events, "events", false, "list the events of the node's TCG event log behind each PCR (type, description, SHA-256 digest); --output json always has them")
	f.BoolVar(&all, "all", false, "print every Node's continuous attestation state, from the records only Gatehouse writes")
	f.StringVar(&namespace, "namespace", charts.Namespace, "namespace of the join service (where the attestation records live; with --all)")
	f.StringVar(&kubeconfig, "kubeconfig", clusterconfig.DefaultKubeconfig, "admin kubeconfig: --all reads the cluster with it; "+
		"--node presents its client certificate to a node that belongs to a cluster (the default file only when it exists)")
	f.StringVar(&stateFile, "state-file", clusterconfig.DefaultStateFile, "cluster state file (holds the cluster ID)")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// nodeAttestation is one row of verify --all: a Node's authoritative
// attestation record (internal/nodeattestation).
type nodeAttestation struct {
	Node     string    `json:"node"`
	Attested string    `json:"attested"` // True, False or Unknown (no record yet)
	Reason   string    `json:"reason,omitempty"`
	Message  string    `json:"message,omitempty"`
	Since    time.Time `json:"since,omitzero"`
	// Checked is the last verification that wrote the record (on a
	// change, or every heartbeat while unchanged).
	Checked time.Time `json:"checked,omitzero"`
	// Tainted says continuous attestation taints the node; AwaitingRestore
	// that an administrator must restore it (gatehouse node restore).
	Tainted         bool `json:"tainted,omitempty"`
	AwaitingRestore bool `json:"awaitingRestore,omitempty"`
	// NodeSays is the Node's own gatehouse.dev/Attested condition when it
	// differs from the record: someone (the node itself?) changed the
	// mirror; the loop writes it back.
	NodeSays string `json:"nodeSays,omitempty"`
}

// printAllNodes prints every Node's continuous attestation state from the
// records the join service's loop keeps in namespace, which nodes cannot
// write (docs/continuous-attestation.md, "The verdict").
func printAllNodes(ctx context.Context, out io.Writer, kubeconfig, namespace, output string) error {
	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	records, err := nodeattestation.NewStore(client, namespace).List(ctx)
	if err != nil {
		return err
	}
	byNode := map[string]nodeattestation.Record{}
	for _, r := range records {
		byNode[r.Node] = r
	}
	rows := make([]nodeAttestation, 0, len(nodes.Items))
	for _, n := range nodes.Items {
		row := nodeAttestation{Node: n.Name, Attested: string(corev1.ConditionUnknown), Message: "not verified yet"}
		rec, ok := byNode[n.Name]
		if ok {
			row = nodeAttestation{Node: n.Name, Attested: string(corev1.ConditionFalse), Reason: rec.Reason, Message: rec.Message,
				Since: rec.Since, Checked: rec.CheckedAt, Tainted: rec.Tainted, AwaitingRestore: rec.AwaitingRestore}
			if rec.Attested {
				row.Attested = string(corev1.ConditionTrue)
			}
		}
		for _, c := range n.Status.Conditions {
			if c.Type == continuous.ConditionType && (!ok || string(c.Status) != row.Attested || c.Reason != row.Reason) {
				row.NodeSays = string(c.Status) + "/" + c.Reason
			}
		}
		rows = append(rows, row)
	}
	if output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tATTESTED\tREASON\tSINCE\tTAINTED\tMESSAGE")
	for _, r := range rows {
		since := "-"
		if !r.Since.IsZero() {
			since = time.Since(r.Since).Round(time.Second).String()
		}
		tainted := "no"
		switch {
		case r.AwaitingRestore:
			tainted = "yes, awaiting restore"
		case r.Tainted:
			tainted = "yes"
		}
		message := r.Message
		if r.NodeSays != "" {
			message += " (the Node's own condition says " + r.NodeSays + ": not from Gatehouse)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, r.Attested, r.Reason, since, tainted, message)
	}
	return w.Flush()
}

func printVerifyReport(out io.Writer, r verifyReport, result *attestation.Result, listEvents bool) error {
	fmt.Fprintf(out, "Node %s is verified (%s, %s).\n", r.Node, r.Variant, r.Identity)
	if r.Endorsement != "" {
		fmt.Fprintf(out, "Its attestation key is trusted by: %s.\n", r.Endorsement)
	}
	fmt.Fprintf(out, "Its evidence proves the roles: %v.\n", r.Roles)
	fmt.Fprintln(out, "Its identities (deny-list entries; docs/joinservice.md, \"Deny list\"), besides node:<Node name>:")
	for _, id := range r.Identities {
		fmt.Fprintln(out, "  "+id)
	}
	if r.ClusterID != "" {
		fmt.Fprintf(out, "PCR %d holds cluster ID %s.\n", keys.NodeLockPCR, r.ClusterID)
	} else {
		fmt.Fprintf(out, "PCR %d is zero: the node has not taken its node lock.\n", keys.NodeLockPCR)
	}
	perPCR := map[uint32][]attestation.BootEvent{}
	for _, e := range result.BootEvents {
		perPCR[e.PCR] = append(perPCR[e.PCR], e)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PCR\tVALUE\tEVENTS")
	for _, i := range slices.Sorted(maps.Keys(result.Measurements)) {
		count := "-"
		if result.BootEvents != nil {
			count = fmt.Sprint(len(perPCR[i]))
		}
		fmt.Fprintf(w, "%d\t%s\t%s\n", i, hex.EncodeToString(result.Measurements[i]), count)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	switch {
	case result.BootEvents == nil:
		fmt.Fprintln(out, "The evidence carries no TCG event log: the PCR values alone were checked.")
	case !listEvents:
		fmt.Fprintf(out, "The node's TCG event log replays to these PCRs: %d events (--events lists them).\n", len(result.BootEvents))
	default:
		fmt.Fprintln(out, "The events of the node's TCG event log behind each PCR (the quote vouches for the digests; types and descriptions are the log's):")
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "PCR\tEVENT\tTYPE\tDESCRIPTION\tDIGEST")
		for _, i := range slices.Sorted(maps.Keys(perPCR)) {
			for _, e := range perPCR[i] {
				fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\n", e.PCR, e.Number, e.Type, e.Description, hex.EncodeToString(e.Digest))
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	for _, warn := range r.Warnings {
		fmt.Fprintln(out, "warning:", warn)
	}
	return nil
}

// refusalError lays out a refusal whose message names the events that
// differ (tpm.ExplanationSuffix) one per line, under the part of the
// message they explain.
type refusalError struct{ err error }

func (e refusalError) Unwrap() error { return e.err }

func (e refusalError) Error() string {
	parts := strings.Split(e.err.Error(), tpm.ExplanationMarker)
	var b strings.Builder
	b.WriteString(parts[0])
	for _, part := range parts[1:] {
		b.WriteString("\n  the TCG event log shows:")
		segments := strings.Split(part, "; ")
		i := 0
		for ; i < len(segments) && strings.HasPrefix(segments[i], "PCR "); i++ {
			b.WriteString("\n    " + segments[i])
		}
		if i < len(segments) {
			b.WriteString("\n" + strings.Join(segments[i:], "; "))
		}
	}
	return b.String()
}
