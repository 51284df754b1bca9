package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/kubeadm"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
	"github.com/gatehouse-dev/gatehouse/mini"
)

func newMiniCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mini",
		Short: "Run a local attested cluster on this machine (as root)",
	}
	cmd.AddCommand(newMiniUpCmd(), newMiniDownCmd(), newMiniLoadCmd(), newMiniStatusCmd(), newMiniNodeCmd(), newMiniAgentCmd(), newMiniServeMirrorCmd())
	cmd.AddCommand(newMiniStopStartCmds()...)
	return cmd
}

func newMiniUpCmd() *cobra.Command {
	opts := mini.Options{}
	var tampered []string
	var kubernetesVersion string
	var rel releaseFlags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create a local cluster: one control plane and --workers workers",
		Long: "Create a local attested Kubernetes cluster. Every node has its own network and mount\n" +
			"namespaces, containerd, kubelet, software TPM and LUKS2 state disk, and runs the real\n" +
			"gatehouse-bootstrapper: the first is initialised with `gatehouse init`, the others\n" +
			"join through the join service. With --provider qemu every node, with --vm-workers N the\n" +
			"last N workers, is instead a VM of the node image (its own firmware, TPM and dm-crypt state disk).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			if opts.BinDir == "" {
				opts.BinDir = filepath.Dir(self)
			}
			if opts.KubeBinDir == "" {
				opts.KubeBinDir = os.Getenv("GATEHOUSE_KUBE_BIN")
			}
			if opts.AddonBinDir == "" {
				opts.AddonBinDir = os.Getenv("GATEHOUSE_ADDON_BIN")
			}
			if !cmd.Flags().Changed("image-cache") {
				opts.ImageCache = defaultImageCache()
			}
			release, err := versions.Resolve(kubernetesVersion)
			if err != nil {
				return fmt.Errorf("--kubernetes-version: %w", err)
			}
			opts.KubernetesVersion = release.Version
			opts.Out = cmd.OutOrStdout()
			// A VM control plane's API server takes minutes to answer
			// under TCG emulation (kubeadm waits up to 20, docs/quickstart.md).
			initTimeout := 10 * time.Minute
			if opts.Provider == mini.ProviderQEMU {
				initTimeout = 30 * time.Minute
			}
			opts.Init = func(ctx context.Context, dir, config, node, secretFile string, components []*componentsv1.Component, out io.Writer) error {
				return runInit(ctx, out, initOptions{
					config: config, node: node, initSecretFile: secretFile,
					masterSecretFile: filepath.Join(dir, clusterconfig.DefaultMasterSecretFile), stateFile: filepath.Join(dir, clusterconfig.DefaultStateFile),
					kubeconfig: filepath.Join(dir, clusterconfig.DefaultKubeconfig), components: components, arch: "amd64", timeout: initTimeout,
					failureLog: filepath.Join(dir, "init-failure.log"),
				})
			}
			if len(tampered) > 0 {
				opts.BootManifest = tamper(tampered)
			}
			if rel.dir != "" {
				services, cleanup, err := releaseServices(cmd, rel)
				if err != nil {
					return err
				}
				defer cleanup()
				opts.Release = services
			}
			return mini.Up(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Dir, "dir", mini.DefaultDir, "directory for the cluster's state")
	f.StringVar(&rel.dir, "release", "", "a release directory (make release; docs/install.md): run its join and key service images and charts, after every signature and digest of the release verifies with --release-key")
	f.StringVar(&rel.key, "release-key", "", "with --release: the release's public key (PKIX PEM)")
	f.IntVar((*int)(&opts.Network), "network", int(mini.DefaultNetwork), fmt.Sprintf("the cluster's network on this machine (0 to %d): bridge ghmini<network>, 10.88.<network>.0/24; clusters on different networks (and directories) run side by side", mini.MaxNetwork))
	f.IntVar(&opts.ControlPlanes, "control-planes", 1, fmt.Sprintf("number of control planes (1 to %d; more than one puts haproxy in front of the API servers)", mini.MaxControlPlanes))
	f.IntVar(&opts.Workers, "workers", 2, fmt.Sprintf("number of worker nodes (0 to %d)", mini.MaxWorkers))
	f.DurationVar(&opts.KubeletCertLifetime, "kubelet-cert-lifetime", kubeadm.DefaultKubeletCertLifetime, "lifetime of kubelet certificates; kubelets renew at 70-90 % of it, approved after fresh evidence")
	f.StringVar(&opts.BinDir, "bin", "", "directory of the gatehouse binaries (default: this binary's)")
	f.StringVar(&opts.KubeBinDir, "kube-bin", "", "directory of the pinned Kubernetes binaries (default $GATEHOUSE_KUBE_BIN)")
	f.StringVar(&kubernetesVersion, "kubernetes-version", versions.Default().Version, "the cluster's Kubernetes version (1.MINOR picks its patch release; supported: "+strings.Join(versions.Supported(), ", ")+"); --kube-bin must hold that build (hack/kube-binaries.sh MINOR)")
	f.StringSliceVar(&opts.UpgradeKubeBinDirs, "upgrade-kube-bin", nil, "directory of a later Kubernetes build (the next minor version's, hack/kube-binaries.sh) the cluster may be upgraded to with `gatehouse upgrade apply --kubernetes`: the nodes carry its images too")
	f.StringVar(&opts.AddonBinDir, "addon-bin", "", "directory of CoreDNS and the registry built by hack/addon-binaries.sh (default $GATEHOUSE_ADDON_BIN)")
	f.StringVar(&opts.ImageCache, "image-cache", "", "directory keeping the built node images, by the digests of the binaries in them; \"\" builds them every time (default $GATEHOUSE_CACHE/mini-images, or ~/.cache/gatehouse/mini-images)")
	f.StringVar(&opts.Provider, "provider", mini.ProviderNetNS, "what every node is: "+mini.ProviderNetNS+" (namespaces on this machine) or "+mini.ProviderQEMU+" (a VM of the node image)")
	f.IntVar(&opts.VMWorkers, "vm-workers", 0, "how many of the workers (the last ones) are VMs of the node image, the rest "+mini.ProviderNetNS+" nodes")
	f.StringVar(&opts.NodeImage, "node-image", "", "directory of the node image VMs boot, as `make image` or hack/node-image.sh prints it; also for VM workers added later, whose signed values the join policy then accepts")
	f.BoolVar(&opts.MirrorImages, "mirror-images", false, "install images as a cluster without internet does: the configuration's mirror names the cluster's registry, the local images are pushed there at the mirror's paths, and the nodes pull every image from it (docs/install-airgapped.md)")
	f.StringSliceVar(&tampered, "tamper", nil, "workers that measure a changed boot manifest (to see a refusal)")
	_ = f.MarkHidden("tamper")
	return cmd
}

// defaultImageCache is where mini up keeps its image archives: beside
// the pinned binaries hack/kube-binaries.sh builds; "" when there is none.
func defaultImageCache() string { return cacheDir("mini-images") }

// cacheDir is sub of Gatehouse's cache: $GATEHOUSE_CACHE, or gatehouse in
// the user's cache directory (where hack/kube-binaries.sh builds); ""
// when there is none.
func cacheDir(sub string) string {
	root := os.Getenv("GATEHOUSE_CACHE")
	if root == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		root = filepath.Join(dir, "gatehouse")
	}
	return filepath.Join(root, sub)
}

// tamper changes the boot manifest of the named nodes by one bit: what a
// node measures that differs from the reference value.
func tamper(nodes []string) func(node string, manifest []byte) []byte {
	return func(node string, manifest []byte) []byte {
		if slices.Contains(nodes, node) && len(manifest) > 0 {
			manifest[len(manifest)-1] ^= 1
		}
		return manifest
	}
}

func newMiniLoadCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "load IMAGE.tar",
		Short: "Push the images of an archive (docker save) into the local cluster's registry",
		Long: "Push every image of the archive (as docker save or podman save writes it) into the local\n" +
			"cluster's registry at " + mini.DefaultNetwork.RegistryAddress() + " (10.88.<network>.1:5000 on another --network), keeping its\n" +
			"repository and tag: an image saved as example.com/team/app:1 is pulled by pods as\n" +
			mini.DefaultNetwork.RegistryAddress() + "/team/app:1.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := mini.Load(cmd.Context(), dir, args[0], cmd.OutOrStdout())
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", mini.DefaultDir, "directory of the cluster's state")
	return cmd
}

func newMiniDownCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Remove the local cluster and everything it made",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return mini.Down(cmd.Context(), dir, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&dir, "dir", mini.DefaultDir, "directory of the cluster's state")
	return cmd
}

func newMiniStatusCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the local cluster's nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return mini.Status(cmd.Context(), dir, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&dir, "dir", mini.DefaultDir, "directory of the cluster's state")
	return cmd
}

func newMiniStopStartCmds() []*cobra.Command {
	var dir string
	stop := &cobra.Command{
		Use:   "stop",
		Short: "Power off every node: processes stop, disks stay",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return mini.Stop(cmd.Context(), dir, cmd.OutOrStdout())
		},
	}
	start := &cobra.Command{
		Use:   "start",
		Short: "Boot every node again after mini stop; the control planes then wait for gatehouse recover",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return mini.Start(cmd.Context(), dir, cmd.OutOrStdout())
		},
	}
	for _, c := range []*cobra.Command{stop, start} {
		c.Flags().StringVar(&dir, "dir", mini.DefaultDir, "directory of the cluster's state")
	}
	return []*cobra.Command{stop, start}
}

func newMiniNodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Work with one node of the local cluster"}
	var (
		dir    string
		tamper bool
	)
	reboot := &cobra.Command{
		Use:   "reboot NAME",
		Short: "Power-cycle a node: its processes stop, its disks stay, its TPM starts from zero and it rejoins",
		Long: "Stop every process of the node (its pods too), keep its disks, and boot it again: its TPM\n" +
			"starts from zero PCRs and measures the boot again, and its bootstrapper finds its state\n" +
			"disk initialised and rejoins through the join service (attested). Its kubelet starts only\n" +
			"once that succeeded. A node that measures differently after the reboot stays out.\n" +
			"Watch it with `gatehouse mini status` or kubectl.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return mini.RebootNode(cmd.Context(), dir, args[0], tamper, cmd.OutOrStdout())
		},
	}
	reboot.Flags().StringVar(&dir, "dir", mini.DefaultDir, "directory of the cluster's state")
	reboot.Flags().BoolVar(&tamper, "tamper", false, "measure a changed boot manifest from this boot on (to see a refusal)")
	_ = reboot.Flags().MarkHidden("tamper")
	cmd.AddCommand(reboot)
	var stopDir string
	stop := &cobra.Command{
		Use:   "stop NAME",
		Short: "Power a node off, as a power cut would: its processes stop, its disks stay",
		Long: "Power a node off: every process of it stops, its disks and TPM stay. The cluster goes on\n" +
			"without it; `gatehouse mini node reboot NAME` boots it again, and it rejoins attested.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return mini.StopNode(cmd.Context(), stopDir, args[0], cmd.OutOrStdout())
		},
	}
	stop.Flags().StringVar(&stopDir, "dir", mini.DefaultDir, "directory of the cluster's state")
	cmd.AddCommand(stop)
	var (
		addDir      string
		addOpts     mini.WorkerOptions
		addUserData string
	)
	add := &cobra.Command{
		Use:   "add",
		Short: "Add a worker: it boots, proves itself to the join service and joins",
		Long: "Add a worker: it boots, proves itself to the join service and joins.\n\n" +
			"With --user-data, a VM worker (--provider qemu) boots the given cloud-config on a NoCloud\n" +
			"seed disk, as an infrastructure provider hands a machine its bootstrap data (a Cluster API\n" +
			"KubeadmConfig's data Secret, docs/capi.md): it joins where and as the data says.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addUserData != "" {
				data, err := os.ReadFile(addUserData)
				if err != nil {
					return fmt.Errorf("reading the user data: %w", err)
				}
				addOpts.UserData = data
			}
			name, err := mini.AddWorker(cmd.Context(), addDir, addOpts, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is joining; watch it with `gatehouse mini status` or kubectl get nodes.\n", name)
			return nil
		},
	}
	add.Flags().StringVar(&addDir, "dir", mini.DefaultDir, "directory of the cluster's state")
	add.Flags().StringVar(&addOpts.Provider, "provider", mini.ProviderNetNS, "what the worker is: "+mini.ProviderNetNS+" (namespaces on this machine) or "+mini.ProviderQEMU+" (a VM of the node image)")
	add.Flags().StringVar(&addOpts.NodeImage, "node-image", "", "directory of the node image a VM boots, when the cluster has none")
	add.Flags().StringVar(&addUserData, "user-data", "", "cloud-config file a VM worker boots with (a Cluster API bootstrap data Secret's value)")
	add.Flags().StringVar(&addOpts.CloudMetadata, "cloud-metadata", "", "gce, aws or azure: the worker takes its name, address and join endpoints from that cloud's instance metadata service at 169.254.169.254 in its network namespace, which you serve there (docs/cloud.md)")
	cmd.AddCommand(add, newMiniNodeExecCmd())
	return cmd
}

func newMiniNodeExecCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "exec NAME -- COMMAND [ARG...]",
		Short: "Run a command on a node (in a namespace node's network and mount namespaces) and print its output",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := mini.Exec(cmd.Context(), dir, args[0], args[1:]...)
			_, _ = cmd.OutOrStdout().Write(out)
			if errors.Is(err, mini.ErrNoExec) {
				return fmt.Errorf("%s: %w (a VM of the node image has no shell by design: its serial console log is under its node directory)", args[0], err)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", mini.DefaultDir, "directory of the cluster's state")
	return cmd
}

// newMiniAgentCmd runs one node; mini up starts it inside the node's
// namespaces.
func newMiniAgentCmd() *cobra.Command {
	var spec string
	cmd := &cobra.Command{
		Use:    "node-agent",
		Short:  "Run one local cluster node (started by mini up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := mini.ReadNodeSpec(spec)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil)).With("node", s.Name)
			return mini.Agent(ctx, s, log)
		},
	}
	cmd.Flags().StringVar(&spec, "spec", "", "node.json")
	return cmd
}

// newMiniServeMirrorCmd serves the local cluster's mirror file server;
// mini up starts it on the host (mini/mirror.go).
func newMiniServeMirrorCmd() *cobra.Command {
	var dir, address string
	cmd := &cobra.Command{
		Use:    "serve-mirror",
		Short:  "Serve the local cluster's mirror of the Kubernetes components (started by mini up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return mini.ServeMirror(ctx, dir, address)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the files to serve, laid out as <original host>/<original path>")
	cmd.Flags().StringVar(&address, "address", "", "host:port to listen on")
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagRequired("address")
	return cmd
}
