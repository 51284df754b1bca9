package cli

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/nodebinding"
)

// identityPrefix is how every attestation identity the join service binds
// begins (attestation.Result.Identity): the SHA-256 of the (v)TPM's AK.
const identityPrefix = "tpm-ak:sha256:"

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Manage which machine may hold a node name",
	}
	cmd.AddCommand(newNodeAdoptCmd(), newNodeRestoreCmd())
	return cmd
}

// adoptOptions are the flags of node adopt.
type adoptOptions struct {
	kubeconfig, namespace, identity string
	ttl                             time.Duration
}

func newNodeAdoptCmd() *cobra.Command {
	var o adoptOptions
	cmd := &cobra.Command{
		Use:   "adopt NAME",
		Short: "Let the next attested machine joining as NAME take over a Node that joined without Gatehouse",
		Long: "A Node that joined with an administrator's bootstrap token, or before Gatehouse was\n" +
			"installed, holds its name without an attestation identity bound to it, and the join\n" +
			"service refuses every machine that asks to join under that name (name_held): it would\n" +
			"get credentials that authenticate as that Node. adopt records that the next attested\n" +
			"machine joining as NAME within --ttl may bind it (with --identity, only that machine),\n" +
			"and who adopted it. The join service audits the binding with the adoption. A name\n" +
			"already bound to a machine cannot be adopted (docs/joinservice.md, \"Nodes that joined\n" +
			"without Gatehouse\").",
		Example: "  gatehouse node adopt worker-7\n" +
			"  gatehouse node adopt worker-7 --identity tpm-ak:sha256:3f… --ttl 4h",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAdopt(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", clusterconfig.DefaultKubeconfig, "admin kubeconfig")
	f.StringVar(&o.namespace, "namespace", charts.Namespace, "namespace of the join service (where node-name bindings live)")
	f.StringVar(&o.identity, "identity", "", "the attestation identity (tpm-ak:sha256:<64 hex digits>) that alone may bind the name; empty: any machine the join policy admits")
	f.DurationVar(&o.ttl, "ttl", time.Hour, "how long the adoption waits for a machine to bind the name; it lapses unused after that")
	return cmd
}

// runAdopt adopts node in the cluster o.kubeconfig reaches, writing the
// human answer to out and the audit line to logs.
func runAdopt(ctx context.Context, out, logs io.Writer, node string, o adoptOptions) error {
	if o.ttl <= 0 {
		return fmt.Errorf("--ttl %v must be positive", o.ttl)
	}
	if o.identity != "" {
		if digest, ok := strings.CutPrefix(o.identity, identityPrefix); !ok || len(digest) != 64 || !isLowerHex(digest) {
			return fmt.Errorf("--identity %q is not an attestation identity: want %s and 64 lower-case hex digits, as the join service's audit log and `gatehouse verify` show it", o.identity, identityPrefix)
		}
	}
	loading := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.kubeconfig}, &clientcmd.ConfigOverrides{})
	restCfg, err := loading.ClientConfig()
	if err != nil {
		return fmt.Errorf("reading the kubeconfig %s: %w", o.kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	by := whoAmI(ctx, client, loading)
	now := time.Now()
	a := nodebinding.Adoption{By: by, At: now, Until: now.Add(o.ttl), Identity: o.identity}
	nodeExists := true
	if _, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		nodeExists = false
	} else if err != nil {
		return fmt.Errorf("looking up Node %s: %w", node, err)
	}

	log := slog.New(slog.NewTextHandler(logs, nil))
	binding := o.namespace + "/" + nodebinding.Name(node)
	attrs := []any{"event", "node.adopt", "node", node, "by", by, "identity", o.identity,
		"until", a.Until.UTC().Format(time.RFC3339), "binding", binding, "nodeExists", nodeExists}
	previous, err := nodebinding.New(client, o.namespace, time.Now).Adopt(ctx, node, a)
	if err != nil {
		log.Warn("audit", append(attrs, "verdict", "refused", "error", err.Error())...)
		return err
	}
	if previous != nil {
		attrs = append(attrs, "replaced", slog.GroupValue(slog.String("by", previous.By), slog.Time("at", previous.At), slog.String("identity", previous.Identity)))
	}
	log.Info("audit", append(attrs, "verdict", "adopted")...)

	who := "The next attested machine"
	if o.identity != "" {
		who = "The machine " + o.identity
	}
	fmt.Fprintf(out, "Adopted node name %s (ConfigMap %s). %s that joins as %s before %s binds it; the join service audits it.\n",
		node, binding, who, node, a.Until.Format(time.RFC3339))
	if previous != nil {
		fmt.Fprintf(out, "This replaces the adoption by %s at %s.\n", previous.By, previous.At.Format(time.RFC3339))
	}
	if !nodeExists {
		fmt.Fprintf(out, "No Node %s exists: the adoption reserves the name until then.\n", node)
	}
	return nil
}

// whoAmI returns the user name the API server knows the kubeconfig's
// credentials by (a SelfSubjectReview, `kubectl auth whoami`), or, when it
// cannot tell, the kubeconfig's user entry.
func whoAmI(ctx context.Context, client kubernetes.Interface, loading clientcmd.ClientConfig) string {
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err == nil && review.Status.UserInfo.Username != "" {
		return review.Status.UserInfo.Username
	}
	raw, rerr := loading.RawConfig()
	if rerr != nil {
		return "unknown"
	}
	if c, ok := raw.Contexts[raw.CurrentContext]; ok && c.AuthInfo != "" {
		return "kubeconfig user " + c.AuthInfo
	}
	return "unknown"
}

func isLowerHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}
