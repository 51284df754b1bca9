package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/nodeattestation"
)

// restoreOptions are the flags of node restore.
type restoreOptions struct {
	kubeconfig, namespace, by string
}

func newNodeRestoreCmd() *cobra.Command {
	var o restoreOptions
	cmd := &cobra.Command{
		Use:   "restore NAME",
		Short: "Restore a node that failed continuous attestation under restore: admin",
		Long: "With the join config's continuousAttestation.restore: admin, a node that failed\n" +
			"continuous attestation stays tainted, and gets no join or rejoin ticket and no kubelet\n" +
			"certificate, until an administrator restores it. restore clears that in the node's\n" +
			"attestation record (which only Gatehouse and administrators can write); the node is\n" +
			"untainted at its next verification that succeeds. It is audited (docs/continuous-attestation.md,\n" +
			"\"Action on failure\").",
		Example: "  gatehouse node restore worker-4",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runRestore(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", clusterconfig.DefaultKubeconfig, "admin kubeconfig")
	f.StringVar(&o.namespace, "namespace", charts.Namespace, "namespace of the join service (where the attestation records live)")
	f.StringVar(&o.by, "by", "", "who restores, for the audit trail (default: the kubeconfig's user)")
	return cmd
}

// runRestore restores node, writing the answer to out and the audit line
// to logs.
func runRestore(ctx context.Context, out, logs io.Writer, node string, o restoreOptions) error {
	loaded, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.kubeconfig}, &clientcmd.ConfigOverrides{}).RawConfig()
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	by := o.by
	if ctxCfg, ok := loaded.Contexts[loaded.CurrentContext]; by == "" && ok {
		by = ctxCfg.AuthInfo
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	before, err := nodeattestation.NewStore(client, o.namespace).Restore(ctx, node, by, time.Now())
	if errors.Is(err, nodeattestation.ErrNoRecord) {
		return fmt.Errorf("node %s has no attestation record in %s: continuous attestation has not judged it, so there is nothing to restore", node, o.namespace)
	}
	if err != nil {
		return err
	}
	slog.New(slog.NewJSONHandler(logs, nil)).Warn("audit", "event", "node.restore", "node", node, "by", by,
		"wasAwaitingRestore", before.AwaitingRestore, "attested", before.Attested, "reason", before.Reason)
	if !before.AwaitingRestore {
		fmt.Fprintf(out, "Node %s was not awaiting a restore (attested %t, %s); nothing changed.\n", node, before.Attested, before.Reason)
		return nil
	}
	fmt.Fprintf(out, "Node %s is restored: it gets credentials again, and loses its taint, once its fresh evidence verifies (last verdict: %s).\n", node, before.Reason)
	return nil
}
