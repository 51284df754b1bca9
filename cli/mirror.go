package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/gatehouse-dev/gatehouse/capi/basetemplate"
	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// newMirrorCmd is `gatehouse mirror`: what a mirror for installs without
// internet holds, and filling one (docs/install-airgapped.md).
func newMirrorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mirror",
		Short: "List, fetch and template what a mirror for installs without internet serves",
		Long: "A mirror serves every download of a cluster: the Kubernetes components from a file server\n" +
			"(<files>/<original host>/<original path>) and the images from an OCI registry\n" +
			"(<registry>/<original registry>/<repository>), with the pinned sha256 digests\n" +
			"(docs/install-airgapped.md).",
	}
	cmd.AddCommand(newMirrorListCmd(), newMirrorSyncCmd(), newMirrorTemplateCmd(), newMirrorContainerdHostsCmd())
	return cmd
}

// mirrorFlags are the flags list and sync share.
type mirrorFlags struct {
	version, kubeadm string
	archs            []string
}

func (f *mirrorFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.version, "kubernetes", versions.Default().Version, "Kubernetes version: 1.MINOR or v1.MINOR.PATCH; supported: "+strings.Join(versions.Supported(), ", "))
	cmd.Flags().StringSliceVar(&f.archs, "arch", []string{"amd64", "arm64"}, "the nodes' CPU architectures")
	cmd.Flags().StringVar(&f.kubeadm, "kubeadm", "", "the version's kubeadm, which names the control plane's images (kubeadm config images list); default: kubeadm on PATH (list) or the one sync fetched")
}

func newMirrorListCmd() *cobra.Command {
	var f mirrorFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Print every file and image a Kubernetes version's cluster downloads",
		Long: "Print every file (\"file <mirror path> <sha256> <official URL>\") and image (\"image <name>\")\n" +
			"a cluster of the Kubernetes version downloads. Serve each file at <files>/<mirror path> and push\n" +
			"each image to <registry>/<its name with the registry's ':' as '_'>; `gatehouse mirror sync` does both.",
		Example: "  gatehouse mirror list --kubernetes 1.36 --kubeadm ./kubeadm",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			release, files, err := f.files()
			if err != nil {
				return err
			}
			kubeadm := f.kubeadm
			if kubeadm == "" {
				if kubeadm, err = exec.LookPath("kubeadm"); err != nil {
					return fmt.Errorf("listing the control plane's images needs kubeadm %s: pass --kubeadm, or run gatehouse mirror sync, which fetches it first", release.Version)
				}
			}
			images, err := mirrorImages(cmd.Context(), kubeadm, release.Version)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, file := range files {
				p, err := mirror.Path(file.URL)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "file %s %s %s\n", p, file.Hash, file.URL)
			}
			for _, img := range images {
				fmt.Fprintf(out, "image %s\n", img)
			}
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func newMirrorSyncCmd() *cobra.Command {
	var (
		f        mirrorFlags
		registry string
	)
	cmd := &cobra.Command{
		Use:   "sync DIR",
		Short: "Fetch a Kubernetes version's files into DIR and copy its images to a registry, checking every digest",
		Long: "Fetch every file of the Kubernetes version into DIR at its mirror path (serve DIR as the\n" +
			"mirror's files), each checked against its pinned sha256 before it is kept; files already\n" +
			"there with their digest are kept. With --registry, copy every image to the mirror's registry\n" +
			"and check the copy's digest against the source's, writing DIR/images.txt (each image and its\n" +
			"mirror name by digest). Run it on a machine that reaches the internet and the mirror.",
		Example: "  gatehouse mirror sync /srv/mirror --kubernetes 1.36 --registry mirror.example:5000",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMirrorSync(cmd.Context(), cmd.OutOrStdout(), args[0], f, registry)
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&registry, "registry", "", "host[:port][/prefix] of the mirror's OCI registry to copy the images to; empty: only print them")
	return cmd
}

func runMirrorSync(ctx context.Context, out io.Writer, dir string, f mirrorFlags, registry string) error {
	release, files, err := f.files()
	if err != nil {
		return err
	}
	var m *mirror.Mirror
	if registry != "" {
		m = &mirror.Mirror{Registry: registry}
		if err := m.Validate(); err != nil {
			return fmt.Errorf("--registry: %w", err)
		}
	}
	fmt.Fprintf(out, "Fetching the %d files of Kubernetes %s into %s\n", len(files), release.Version, dir)
	if err := mirror.SyncFiles(ctx, &http.Client{Timeout: 30 * time.Minute}, dir, files, out); err != nil {
		return err
	}
	kubeadm := f.kubeadm
	if kubeadm == "" {
		if kubeadm, err = fetchedKubeadm(release, dir); err != nil {
			return err
		}
		defer os.Remove(kubeadm)
	}
	images, err := mirrorImages(ctx, kubeadm, release.Version)
	if err != nil {
		return err
	}
	if m == nil {
		fmt.Fprintf(out, "Images to push to the mirror's registry (<registry>/<name>):\n")
		for _, img := range images {
			fmt.Fprintf(out, "  %s\n", img)
		}
		return nil
	}
	var lines []string
	for i, img := range images {
		fmt.Fprintf(out, "[%d/%d] copying %s\n", i+1, len(images), img)
		pinned, err := m.CopyImage(ctx, img)
		if err != nil {
			return err
		}
		lines = append(lines, img+" "+pinned)
	}
	list := filepath.Join(dir, "images.txt")
	if err := os.WriteFile(list, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil { //nolint:gosec // a public list
		return err
	}
	fmt.Fprintf(out, "Copied %d images to %s; their digests are in %s\n", len(images), registry, list)
	return nil
}

// files resolves the version and lists its files for the architectures.
func (f mirrorFlags) files() (versions.Release, []mirror.File, error) {
	release, err := versions.Resolve(f.version)
	if err != nil {
		return release, nil, fmt.Errorf("--kubernetes: %w", err)
	}
	files, err := mirror.Files(release, f.archs)
	if err != nil {
		return release, nil, fmt.Errorf("--arch: %w", err)
	}
	return release, files, nil
}

// fetchedKubeadm copies the kubeadm sync fetched for this machine's
// architecture into an executable temporary file (the mirror's copy stays
// a plain file) and returns its path.
func fetchedKubeadm(release versions.Release, dir string) (string, error) {
	list, err := release.Components(runtime.GOARCH)
	if err != nil {
		return "", fmt.Errorf("naming the images needs this machine's kubeadm: %w; pass --kubeadm", err)
	}
	for _, c := range list {
		if c.Name != "kubeadm" {
			continue
		}
		p, err := mirror.Path(c.URL)
		if err != nil {
			return "", err
		}
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			return "", fmt.Errorf("naming the images needs kubeadm %s for %s: %w (add --arch %s, or pass --kubeadm)", release.Version, runtime.GOARCH, err, runtime.GOARCH)
		}
		tmp, err := os.CreateTemp("", "gatehouse-kubeadm-*")
		if err != nil {
			return "", err
		}
		defer tmp.Close()
		if _, err := tmp.Write(data); err != nil {
			return "", err
		}
		if err := tmp.Chmod(0o700); err != nil {
			return "", err
		}
		return tmp.Name(), nil
	}
	return "", errors.New("the versions table has no kubeadm")
}

// mirrorImages lists every image a cluster pulls: the control plane's
// (kubeadm config images list, which names kube-apiserver,
// kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS, the pause
// sandbox image and etcd) and the Gatehouse charts'.
func mirrorImages(ctx context.Context, kubeadm, version string) ([]string, error) {
	out, err := exec.CommandContext(ctx, kubeadm, "config", "images", "list", "--kubernetes-version", version).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(exit.Stderr)))
		}
		return nil, fmt.Errorf("%s config images list --kubernetes-version %s: %w", kubeadm, version, err)
	}
	images := strings.Fields(string(out))
	for _, name := range charts.Names {
		c, err := charts.Load(name)
		if err != nil {
			return nil, err
		}
		img, _ := c.Values["image"].(map[string]any)
		repo, _ := img["repository"].(string)
		tag, _ := img["tag"].(string)
		if repo == "" || tag == "" {
			return nil, fmt.Errorf("chart %s has no image.repository and image.tag", name)
		}
		ref := repo + ":" + tag
		if digest, _ := img["digest"].(string); digest != "" {
			ref += "@" + digest
		}
		images = append(images, ref)
	}
	sort.Strings(images)
	return images, nil
}

func newMirrorTemplateCmd() *cobra.Command {
	var (
		version, config, files string
		archs                  []string
		force                  bool
	)
	cmd := &cobra.Command{
		Use:   "template DIR",
		Short: "Write the CAPI provider's base template of a Kubernetes version into DIR",
		Long: "Write DIR/<version>/components.yaml, the Cluster API provider's base template of the\n" +
			"Kubernetes version (its --template-dir, docs/capi.md \"Base templates\"): the versions table's\n" +
			"components with their URLs on the mirror (--mirror-files, or the cluster configuration's).",
		Example: "  gatehouse mirror template ./templates --kubernetes 1.36 --mirror-files https://mirror.example/files",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			release, err := versions.Resolve(version)
			if err != nil {
				return fmt.Errorf("--kubernetes: %w", err)
			}
			m := mirrorOf(files, "")
			if config != "" {
				if files != "" {
					return errors.New("give --mirror-files or --config, not both")
				}
				cfg, err := clusterconfig.Load(config)
				if err != nil {
					return err
				}
				m = cfg.Mirror
			}
			if err := m.Validate(); err != nil {
				return fmt.Errorf("--mirror-files: %w", err)
			}
			f, err := basetemplate.FromTable(release, m, archs)
			if err != nil {
				return err
			}
			data, err := yaml.Marshal(f)
			if err != nil {
				return err
			}
			data = append([]byte("# The components a Machine of Kubernetes "+release.Version+" downloads (gatehouse mirror template; docs/capi.md).\n"), data...)
			if _, err := basetemplate.Parse(data, release.Version); err != nil {
				return fmt.Errorf("the written template is invalid: %w", err)
			}
			path := filepath.Join(args[0], release.Version, basetemplate.FileName)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil { //nolint:gosec // templates are public
				return err
			}
			if err := writeNew(path, data, 0o644, force); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s: the provider supports Kubernetes %s from now on\n", path, release.Version)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&version, "kubernetes", versions.Default().Version, "Kubernetes version: 1.MINOR or v1.MINOR.PATCH; supported: "+strings.Join(versions.Supported(), ", "))
	f.StringSliceVar(&archs, "arch", []string{"amd64", "arm64"}, "the Machines' CPU architectures")
	f.StringVar(&files, "mirror-files", "", "base URL of the mirror's file server; empty: the official URLs")
	f.StringVar(&config, "config", "", "take the mirror from this cluster configuration instead")
	f.BoolVar(&force, "force", false, "overwrite an existing template")
	return cmd
}

func newMirrorContainerdHostsCmd() *cobra.Command {
	var (
		registry  string
		upstreams []string
		plainHTTP bool
	)
	cmd := &cobra.Command{
		Use:   "containerd-hosts DIR",
		Short: "Write containerd's hosts.toml files that send a node's image pulls to the mirror's registry",
		Long: "Write DIR/<upstream>/hosts.toml for each upstream registry: containerd then pulls that\n" +
			"registry's images (the pause image, the control plane's, workloads') from the mirror's registry\n" +
			"at <registry>/<upstream>/<repository>, checking every blob's digest. Put DIR at\n" +
			"/etc/containerd/certs.d on the nodes' image, with containerd's config_path pointing there\n" +
			"(docs/install-airgapped.md).",
		Example: "  gatehouse mirror containerd-hosts ./certs.d --registry mirror.example:5000 --upstream ghcr.io",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m := &mirror.Mirror{Registry: registry}
			if err := m.Validate(); err != nil {
				return fmt.Errorf("--registry: %w", err)
			}
			for _, upstream := range upstreams {
				data, err := m.ContainerdHosts(upstream, plainHTTP)
				if err != nil {
					return err
				}
				path := filepath.Join(args[0], upstream, "hosts.toml")
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil { //nolint:gosec // containerd's configuration: public
					return err
				}
				if err := os.WriteFile(path, data, 0o644); err != nil { //nolint:gosec // as above
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s\n", path)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&registry, "registry", "", "host[:port][/prefix] of the mirror's OCI registry (required)")
	cmd.Flags().StringSliceVar(&upstreams, "upstream", []string{mirrorKubeadmRegistry, "docker.io"}, "registries whose pulls go to the mirror")
	cmd.Flags().BoolVar(&plainHTTP, "plain-http", false, "speak plain HTTP to the mirror's registry")
	_ = cmd.MarkFlagRequired("registry")
	return cmd
}

// mirrorKubeadmRegistry is where kubeadm names the control plane's
// images.
const mirrorKubeadmRegistry = "registry.k8s.io"

// mirrorOf is the mirror of the flags, or nil when both are empty.
func mirrorOf(files, registry string) *mirror.Mirror {
	if files == "" && registry == "" {
		return nil
	}
	return &mirror.Mirror{Files: files, Registry: registry}
}
