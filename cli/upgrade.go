package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/upgrade"
)

func newUpgradeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade the cluster's Gatehouse services",
	}
	cmd.AddCommand(newUpgradeApplyCmd())
	return cmd
}

func newUpgradeApplyCmd() *cobra.Command {
	opts := upgrade.Options{}
	var chartsDir string
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Upgrade the join and key service releases to this CLI's charts",
		Long: "Back up every CRD and custom resource under gatehouse-upgrade/<timestamp>-<random>/backups,\n" +
			"then upgrade each Gatehouse Helm release to the chart built into this CLI, one at a\n" +
			"time and atomically: a release that fails is rolled back. The cluster's own values\n" +
			"are applied over the new chart's defaults. A chart may advance one minor version at\n" +
			"a time. --dry-run prints what would change and changes nothing. Running it again\n" +
			"after an interruption is safe.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Out = cmd.OutOrStdout()
			opts.Charts = map[string]*chart.Chart{}
			opts.Order = charts.Names
			for _, name := range charts.Names {
				load := charts.Load
				if chartsDir != "" {
					load = func(name string) (*chart.Chart, error) { return loader.Load(filepath.Join(chartsDir, name)) }
				}
				c, err := load(name)
				if err != nil {
					return fmt.Errorf("loading chart %s: %w", name, err)
				}
				opts.Charts[name] = c
			}
			if opts.BackupRoot == "" {
				wd, err := os.Getwd()
				if err != nil {
					return err
				}
				opts.BackupRoot = wd
			}
			results, err := upgrade.Apply(cmd.Context(), opts)
			fmt.Fprintln(cmd.OutOrStdout(), "\nSummary:")
			for _, r := range results {
				fmt.Fprintf(cmd.OutOrStdout(), "  %-24s %s\n", r.Release, r.Outcome)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Kubeconfig, "kubeconfig", clusterconfig.DefaultKubeconfig, "admin kubeconfig")
	f.StringVar(&opts.Namespace, "namespace", charts.Namespace, "namespace of the Gatehouse releases")
	f.StringVar(&opts.BackupRoot, "backup-dir", "", "where gatehouse-upgrade/<timestamp>-<random>/backups is written (default: the current directory)")
	f.BoolVar(&opts.DryRun, "dry-run", false, "print what would change; change nothing")
	f.DurationVar(&opts.Timeout, "timeout", 5*time.Minute, "time each release may take, waiting included")
	f.StringVar(&chartsDir, "charts-dir", "", "directory holding gatehouse-joinservice/ and gatehouse-keyservice/ charts to use instead of the built-in ones")
	f.BoolVar(&opts.Wait, "wait", true, "wait for upgraded resources to be ready (a release that does not become ready is rolled back)")
	return cmd
}
