package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/signedvalues"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/components"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
	"github.com/gatehouse-dev/gatehouse/upgrade"
	"github.com/gatehouse-dev/gatehouse/upgrade/kuberoll"
)

// joinServiceRelease is the Helm release holding the join configuration.
const joinServiceRelease = "gatehouse-joinservice"

func newUpgradeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade the cluster's Kubernetes version and Gatehouse services",
	}
	cmd.AddCommand(newUpgradeApplyCmd())
	return cmd
}

// kubeRollFlags are upgrade apply's Kubernetes flags.
type kubeRollFlags struct {
	version, kubeBin string
	// config, when set, is the cluster configuration whose mirror the
	// components come from (docs/install-airgapped.md).
	config string
	roll   kuberoll.Options
}

func newUpgradeApplyCmd() *cobra.Command {
	opts := upgrade.Options{}
	var chartsDir string
	var k kubeRollFlags
	var rel releaseFlags
	var nv nodeValuesFlags
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Upgrade Kubernetes (--kubernetes) and the join and key service releases to this CLI's charts",
		Long: "With --kubernetes VERSION, first move the cluster to that Kubernetes release in kubeadm's\n" +
			"order, one node at a time: control planes (the first runs kubeadm upgrade apply, the\n" +
			"others kubeadm upgrade node, etcd's quorum checked before each), then workers, each\n" +
			"cordoned, drained (PodDisruptionBudgets respected), moved by its own upgrade agent and\n" +
			"uncordoned once Ready at the new version. A minor version picks its patch release;\n" +
			"skipping a minor version and downgrades are refused before anything changes. Once the\n" +
			"first control plane moved, the join configuration names the new release and the\n" +
			"Gatehouse releases are upgraded, so nodes that join from then on get it. A node that\n" +
			"fails stops the roll; running the command again resumes where it stopped.\n\n" +
			"The Gatehouse releases: back up every CRD and custom resource under\n" +
			"gatehouse-upgrade/<timestamp>-<random>/backups, then upgrade each Gatehouse Helm release to\n" +
			"the chart built into this CLI, one at a time and atomically: a release that fails is\n" +
			"rolled back. The cluster's own values are applied over the new chart's defaults. A chart\n" +
			"may advance one minor version at a time. --dry-run prints the plan and what would change\n" +
			"and changes nothing. Running it again after an interruption is safe (docs/upgrades.md).\n\n" +
			"With --node-values FILE (new node software's signed reference values, checked with\n" +
			"--node-values-key), the join policy first accepts them beside the values the nodes prove\n" +
			"now, and at the end every node's fresh evidence is fetched: the values they replace (the\n" +
			"role's sets over the same PCRs) that no node proves anymore are retired. Nodes still\n" +
			"running the old software are named; replace them and run the command again.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			opts.Out = out
			opts.Charts = map[string]*chart.Chart{}
			opts.Order = charts.Names
			if rel.dir != "" {
				if chartsDir != "" {
					return errors.New("--release and --charts-dir both name the charts: give one")
				}
				if err := releaseCharts(cmd, rel, &opts); err != nil {
					return err
				}
			}
			for _, name := range charts.Names {
				if opts.Charts[name] != nil {
					continue
				}
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
			if k.config != "" {
				cfg, err := clusterconfig.Load(k.config)
				if err != nil {
					return fmt.Errorf("--config: %w", err)
				}
				mirrored, err := mirrorReleaseValues(cfg.Mirror, opts.Charts)
				if err != nil {
					return err
				}
				if mirrored != nil && rel.registry != "" {
					return errors.New("--release-registry and the configuration's mirror.registry both say where the images come from: give one")
				}
				// The mirror's repositories over a --release's (its digests kept).
				for name, v := range mirrored {
					if opts.Values == nil {
						opts.Values = map[string]map[string]any{}
					}
					opts.Values[name] = mergeReleaseValues(opts.Values[name], v)
				}
			}
			var values signedvalues.Values
			if nv.key != "" && !nv.enabled() {
				return errors.New("--node-values-key without --node-values: give the signed values the key checks")
			}
			if nv.enabled() {
				var err error
				if values, err = nv.load(cmd.Context()); err != nil {
					return err
				}
				if err := acceptNodeValues(cmd.Context(), opts, values); err != nil {
					return err
				}
				if k.version != "" {
					if k.roll.Replace, err = nodesToReplace(cmd.Context(), opts, nv, values); err != nil {
						return err
					}
				}
			}
			var err error
			if k.version != "" {
				err = rollKubernetes(cmd.Context(), k, opts)
			} else {
				err = applyReleases(cmd.Context(), opts)
			}
			if err != nil || !nv.enabled() {
				return err
			}
			return retireNodeValues(cmd.Context(), opts, nv, values)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Kubeconfig, "kubeconfig", clusterconfig.DefaultKubeconfig, "admin kubeconfig (kubeadm's admin.conf: its client certificate also opens the nodes' upgrade agents)")
	f.StringVar(&opts.Namespace, "namespace", charts.Namespace, "namespace of the Gatehouse releases")
	f.StringVar(&opts.BackupRoot, "backup-dir", "", "where gatehouse-upgrade/<timestamp>-<random>/backups is written (default: the current directory)")
	f.BoolVar(&opts.DryRun, "dry-run", false, "print the plan and what would change; change nothing")
	f.DurationVar(&opts.Timeout, "timeout", 5*time.Minute, "time each release may take, waiting included")
	f.StringVar(&chartsDir, "charts-dir", "", "directory holding gatehouse-joinservice/ and gatehouse-keyservice/ charts to use instead of the built-in ones")
	f.StringVar(&rel.dir, "release", "", "a release directory (make release; docs/install.md): upgrade to its charts, which run its images by digest, after every signature and digest of the release verifies with --release-key")
	f.StringVar(&rel.key, "release-key", "", "with --release: the release's public key (PKIX PEM)")
	f.StringVar(&rel.registry, "release-registry", "", "with --release: run the images from this registry (host[:port][/path]) holding copies of the release's images, still by the release's digests (default: the registry the release names)")
	f.BoolVar(&opts.Wait, "wait", true, "wait for upgraded resources to be ready (a release that does not become ready is rolled back)")
	f.StringVar(&k.version, "kubernetes", "", "move the cluster to this Kubernetes release first: 1.MINOR (its patch release from the versions table) or v1.MINOR.PATCH; supported: "+strings.Join(versions.Supported(), ", "))
	f.StringVar(&k.kubeBin, "kube-bin", "", "with --kubernetes: take kubelet, kubeadm and kubectl from this local build (hack/kube-binaries.sh; file:// URLs the nodes can read, sha256 computed) instead of the official downloads")
	f.StringVar(&k.config, "config", "", "cluster configuration whose mirror is used (docs/install-airgapped.md): with --kubernetes the nodes download the components from it; its registry gives the Gatehouse releases' images and the join config's imageMirror; empty: the official downloads and registries")
	f.StringVar(&nv.file, "node-values", "", "new node software's signed reference values (reference-values.signed.json of a node image): accepted before anything moves; the values they replace are retired once no node proves them (docs/upgrades.md)")
	f.StringVar(&nv.key, "node-values-key", "", "with --node-values: the public key (PEM) the values are signed with")
	f.StringVar(&nv.stateFile, "state-file", clusterconfig.DefaultStateFile, "with --node-values: cluster state file (the cluster ID the nodes' evidence shows)")
	f.IntVar(&nv.evidencePort, "evidence-port", 9001, "with --node-values: the nodes' evidence endpoint port (gatehouse-bootstrapper serve-evidence), where fresh evidence is fetched")
	f.BoolVar(&k.roll.ForceDrain, "force-drain", false, "with --kubernetes: also evict pods no controller manages (kubectl drain --force); without it such a pod stops the roll")
	f.DurationVar(&k.roll.NodeTimeout, "node-timeout", kuberoll.DefaultNodeTimeout, "with --kubernetes: time one node may take (drain, kubeadm, kubelet, Ready)")
	f.DurationVar(&k.roll.DrainTimeout, "drain-timeout", kuberoll.DefaultDrainTimeout, "with --kubernetes: time a drain may take (evictions a PodDisruptionBudget refuses are retried until then)")
	f.DurationVar(&k.roll.KubeletTimeout, "kubelet-timeout", 2*time.Minute, "with --kubernetes: time a restarted kubelet may take to become healthy")
	return cmd
}

// applyReleases upgrades the Gatehouse releases and prints the summary.
func applyReleases(ctx context.Context, opts upgrade.Options) error {
	results, err := upgrade.Apply(ctx, opts)
	fmt.Fprintln(opts.Out, "\nSummary:")
	for _, r := range results {
		fmt.Fprintf(opts.Out, "  %-24s %s\n", r.Release, r.Outcome)
	}
	return err
}

// rollKubernetes moves the cluster to k.version, switching the join
// configuration and upgrading the Gatehouse releases once the first
// control plane moved.
func rollKubernetes(ctx context.Context, k kubeRollFlags, opts upgrade.Options) error {
	release, err := versions.Resolve(k.version)
	if err != nil {
		return fmt.Errorf("--kubernetes: %w", err)
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	agents, err := kuberoll.NewAgentClient(restCfg)
	if err != nil {
		return err
	}
	var m *mirror.Mirror
	if k.config != "" {
		cfg, err := clusterconfig.Load(k.config)
		if err != nil {
			return fmt.Errorf("--config: %w", err)
		}
		m = cfg.Mirror
	}
	nodeComponents := func(arch string) ([]*componentsv1.Component, error) {
		return upgradeComponents(release, k.kubeBin, m, arch, true)
	}
	// The join configuration holds one architecture's list, as `gatehouse
	// init --arch` wrote it: the control planes'.
	arch, err := controlPlaneArch(ctx, client)
	if err != nil {
		return err
	}
	list, err := upgradeComponents(release, k.kubeBin, m, arch, false)
	if err != nil {
		return err
	}
	encoded, err := components.MarshalList(list)
	if err != nil {
		return err
	}
	if opts.Values == nil {
		opts.Values = map[string]map[string]any{}
	}
	opts.Values[joinServiceRelease] = mergeReleaseValues(opts.Values[joinServiceRelease], map[string]any{"joinConfig": map[string]any{
		"kubernetesVersion": release.Version, "kubernetesComponents": encoded,
	}})
	roll := k.roll
	roll.Client, roll.Agent, roll.Release, roll.Components, roll.DryRun, roll.Out = client, agents, release, nodeComponents, opts.DryRun, opts.Out
	roll.SwitchJoinConfig = func(ctx context.Context) error {
		fmt.Fprintf(opts.Out, "The join configuration names %s; upgrading the Gatehouse releases\n", release.Version)
		return applyReleases(ctx, opts)
	}
	if err := kuberoll.Run(ctx, roll); err != nil {
		return err
	}
	if opts.DryRun {
		fmt.Fprintln(opts.Out, "\nThe Gatehouse releases, once the first control plane moved:")
		return applyReleases(ctx, opts)
	}
	return nil
}

// controlPlaneArch is the CPU architecture of the first control plane (by
// name) as its kubelet reports it; amd64 when none reports one.
func controlPlaneArch(ctx context.Context, client kubernetes.Interface) (string, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "node-role.kubernetes.io/control-plane"})
	if err != nil {
		return "", fmt.Errorf("listing the control planes: %w", err)
	}
	arch, first := "amd64", ""
	for _, n := range nodes.Items {
		if a := n.Status.NodeInfo.Architecture; a != "" && (first == "" || n.Name < first) {
			arch, first = a, n.Name
		}
	}
	return arch, nil
}

// upgradeComponents returns release's components for arch that a roll
// hands out: only kubelet, kubeadm and kubectl for a node's upgrade agent
// (nodes), the whole list (crictl and the CNI plugins too, where
// official) for the join configuration. With kubeBin they are its local
// build's (file:// URLs); otherwise the versions table's, through the
// mirror m when set (docs/install-airgapped.md).
func upgradeComponents(release versions.Release, kubeBin string, m *mirror.Mirror, arch string, nodes bool) ([]*componentsv1.Component, error) {
	if kubeBin != "" {
		return release.LocalBuild(arch, kubeBin)
	}
	list, err := release.Components(arch)
	if err != nil {
		return nil, err
	}
	var out []*componentsv1.Component
	for _, c := range list {
		switch c.Name {
		case "kubelet", "kubeadm", "kubectl":
		default:
			if nodes {
				continue
			}
		}
		out = append(out, &componentsv1.Component{Url: c.URL, Hash: c.Hash, InstallPath: c.InstallPath, Extract: c.Extract})
	}
	return m.Components(out)
}
