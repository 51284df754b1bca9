package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/kms"
	"github.com/gatehouse-dev/gatehouse/internal/kms/kek"
)

func newKMSCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kms",
		Short: "Manage the external KMS that wraps the master secret",
	}
	cmd.AddCommand(newKMSRewrapCmd())
	return cmd
}

type rewrapOptions struct {
	masterSecretFile, kek, kubeconfig, namespace, secret, secretKey string
	timeout                                                         time.Duration
}

func newKMSRewrapCmd() *cobra.Command {
	var o rewrapOptions
	cmd := &cobra.Command{
		Use:   "rewrap",
		Short: "Re-wrap the master secret under the KEK's current version or another KEK, without downtime",
		Long: "Re-wraps the master secret the master secret file carries: under its key-encryption key's\n" +
			"current version (after rotating the key in the KMS), or under another KEK (--kek). Within one\n" +
			"AWS KMS or one Vault Transit key the secret never leaves the KMS (ReEncrypt, rewrap); between\n" +
			"KMSs it is unwrapped and wrapped again in this process's memory only. A plain master secret\n" +
			"file is wrapped for the first time with --kek. The new wrapped secret is checked to unwrap to\n" +
			"the same secret, then written to the file and to the key service's Secret; the key service\n" +
			"takes it at its next KMS check, serving keys throughout. Disable the old key only after\n" +
			"that (docs/keys.md, \"Rotation\").",
		Example: "  gatehouse kms rewrap\n" +
			"  gatehouse kms rewrap --kek 'kms://aws-kms?key-id=alias/gatehouse-2027&region=eu-west-1'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var client kubernetes.Interface
			if o.kubeconfig != "" {
				cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
					&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.kubeconfig}, &clientcmd.ConfigOverrides{}).ClientConfig()
				if err != nil {
					return fmt.Errorf("reading the kubeconfig %s (give --kubeconfig \"\" to update only the file): %w", o.kubeconfig, err)
				}
				if client, err = kubernetes.NewForConfig(cfg); err != nil {
					return err
				}
			}
			return runRewrap(cmd.Context(), cmd.OutOrStdout(), o, client)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.masterSecretFile, "master-secret-file", clusterconfig.DefaultMasterSecretFile, "the master secret file gatehouse init wrote")
	f.StringVar(&o.kek, "kek", "", "KMS URI of the key-encryption key to wrap under (empty: the current one, at its current version)")
	f.StringVar(&o.kubeconfig, "kubeconfig", clusterconfig.DefaultKubeconfig, "admin kubeconfig of the cluster whose key service Secret is updated (empty: update only the file)")
	f.StringVar(&o.namespace, "namespace", charts.Namespace, "namespace of the key service")
	f.StringVar(&o.secret, "secret", "gatehouse-kms", "the key service's Secret holding the KMS URI")
	f.StringVar(&o.secretKey, "secret-key", "kms-uri", "the key in that Secret")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up after this long")
	return cmd
}

// runRewrap re-wraps o's master secret file and, with a client, the key
// service's Secret.
func runRewrap(ctx context.Context, out io.Writer, o rewrapOptions, client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	stored, err := clusterconfig.ReadMasterSecret(o.masterSecretFile)
	if err != nil {
		return err
	}
	var uri string
	switch {
	case stored.KMS == "" && o.kek == "":
		return fmt.Errorf("%s holds the master secret in plain: give --kek to wrap it under an external KMS", o.masterSecretFile)
	case stored.KMS == "":
		fmt.Fprintf(out, "Wrapping the plain master secret of %s under %s\n", o.masterSecretFile, describeKEK(o.kek))
		uri, err = kek.WrapNew(ctx, o.kek, stored.Key, stored.Salt)
	default:
		to := "its current KEK"
		if o.kek != "" {
			to = describeKEK(o.kek)
		}
		fmt.Fprintf(out, "Re-wrapping the master secret of %s under %s\n", o.masterSecretFile, to)
		uri, err = kek.Rewrap(ctx, stored.KMS, o.kek)
	}
	if err != nil {
		return fmt.Errorf("nothing was changed: %w", err)
	}
	data, err := json.MarshalIndent(clusterconfig.MasterSecret{KMS: uri}, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(o.masterSecretFile, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("the re-wrapped secret is checked but writing %s failed (the old one is kept; run again): %w", o.masterSecretFile, err)
	}
	fmt.Fprintf(out, "Wrote %s (checked: it unwraps to the same master secret)\n", o.masterSecretFile)
	if client == nil {
		fmt.Fprintln(out, "No kubeconfig: the key service's Secret is not updated; put the file's kms URI into it before disabling the old key.")
		return nil
	}
	wasPlain, err := updateKMSSecret(ctx, client, o, uri)
	if err != nil {
		return fmt.Errorf("%s is updated, but the key service's Secret is not (run again): %w", o.masterSecretFile, err)
	}
	fmt.Fprintf(out, "Updated Secret %s/%s\n", o.namespace, o.secret)
	if wasPlain {
		fmt.Fprintf(out, "The key service ran from a plain master secret: restart it to use the external KMS\n"+
			"  (kubectl -n %s rollout restart daemonset,deployment -l app.kubernetes.io/name=gatehouse-keyservice).\n", o.namespace)
	} else {
		fmt.Fprintln(out, "The key service takes the new wrapped secret at its next KMS check, once the kubelet has updated\n"+
			"the mounted Secret (about a minute, plus --kms-check-interval); gatehouse_keyservice_kms_checks_total\n"+
			"counts its checks. Disable or retire the old key only after that.")
	}
	return nil
}

// updateKMSSecret writes uri into the key service's Secret and says
// whether it held a plain master secret before.
func updateKMSSecret(ctx context.Context, client kubernetes.Interface, o rewrapOptions, uri string) (wasPlain bool, err error) {
	secret, err := client.CoreV1().Secrets(o.namespace).Get(ctx, o.secret, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading Secret %s/%s: %w", o.namespace, o.secret, err)
	}
	old, ok := secret.Data[o.secretKey]
	if !ok {
		return false, fmt.Errorf("secret %s/%s has no key %q", o.namespace, o.secret, o.secretKey)
	}
	parsed, err := kms.ParseURI(strings.TrimSpace(string(old)))
	if err == nil {
		_, external := kms.External(parsed)
		wasPlain = !external
	}
	secret.Data[o.secretKey] = []byte(uri)
	if _, err := client.CoreV1().Secrets(o.namespace).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("updating Secret %s/%s: %w", o.namespace, o.secret, err)
	}
	return wasPlain, nil
}

// describeKEK names a KEK URI's backend and key, nothing else (a URI
// given by mistake may carry a secret).
func describeKEK(uri string) string {
	parsed, _ := kms.ParseURI(uri)
	switch u := parsed.(type) {
	case *kms.AWSKMSURI:
		return "AWS KMS key " + u.KeyID + " (" + u.Region + ")"
	case *kms.VaultTransitURI:
		return "Vault Transit key " + u.Mount + "/" + u.Key + " at " + u.Address
	}
	return "the KEK --kek names"
}
