package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gatehouse-dev/gatehouse/image/build"
)

func newImageBuildCmd() *cobra.Command {
	opts := build.Options{}
	var output, signingKeyFile, platform string
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build the node image: a Debian 12 raw GPT disk with a dm-verity root and a UKI per role (as root)",
		Long: "Build the Gatehouse node image from Debian 12's packages, the pinned kubelet, kubeadm and kubectl, and\n" +
			"the bootstrapper: a read-only squashfs root under dm-verity and, for each role (control plane, worker),\n" +
			"a unified kernel image whose measured command line holds the root hash and the role, on the EFI\n" +
			"system partition of a raw GPT disk. The root file system and the assembled image are cached by\n" +
			"content: a second build with nothing changed takes seconds. See docs/image.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("unknown --output %q: use text or json", output)
			}
			if !cmd.Flags().Changed("cache-dir") {
				opts.CacheDir = defaultImageBuildCache()
			}
			if opts.KubeBinDir == "" {
				opts.KubeBinDir = os.Getenv("GATEHOUSE_KUBE_BIN")
			}
			if opts.Bootstrapper == "" {
				opts.Source = moduleRoot()
			}
			opts.Progress = cmd.ErrOrStderr()
			if output == "text" {
				opts.Progress = cmd.OutOrStdout()
			}
			res, err := build.Build(cmd.Context(), opts)
			if err != nil {
				return err
			}
			defaultKey := !cmd.Flags().Changed("signing-key")
			if defaultKey {
				signingKeyFile = filepath.Join(opts.CacheDir, "signing-key.pem")
			}
			if err := signBuild(cmd.Context(), opts.Progress, res, platform, signingKeyFile, defaultKey, opts.Out); err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			printImageResult(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.CacheDir, "cache-dir", "", "directory caching the root file system, the .deb files and the built images (default $GATEHOUSE_CACHE/image, or ~/.cache/gatehouse/image)")
	f.StringVar(&opts.Out, "out", "", "also copy the outputs (disks, UKIs, manifest.json) into this directory; they stay in the cache")
	f.StringVar(&opts.KubeBinDir, "kube-bin", "", "directory of the pinned kubelet, kubeadm and kubectl (default $GATEHOUSE_KUBE_BIN; hack/kube-binaries.sh prints it)")
	f.StringVar(&opts.Bootstrapper, "bootstrapper", "", "gatehouse-bootstrapper binary to bake in (default: built from the Gatehouse checkout in the current directory)")
	f.StringVar(&opts.Mirror, "mirror", build.DefaultMirror, "Debian archive the packages come from (its security archive is the one beside it: …/debian-security)")
	f.BoolVar(&opts.Rebuild, "rebuild", false, "assemble the image again even when the cache has it (the root file system stays cached)")
	f.StringVar(&signingKeyFile, "signing-key", "", "PEM private key (Ed25519 or ECDSA P-256; gatehouse image keygen) that signs the build's reference values (default: CACHE/signing-key.pem, created on first use)")
	f.StringVar(&platform, "platform", "qemu-ovmf", "platform whose firmware the reference values are predicted for (image/predict/platforms)")
	f.StringVarP(&output, "output", "o", "text", "result format: text (with progress) or json (progress on standard error)")
	return cmd
}

// defaultImageBuildCache is $GATEHOUSE_CACHE/image, or gatehouse/image in
// the user's cache directory.
func defaultImageBuildCache() string {
	root := os.Getenv("GATEHOUSE_CACHE")
	if root == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		root = filepath.Join(dir, "gatehouse")
	}
	return filepath.Join(root, "image")
}

// moduleRoot returns the Gatehouse checkout holding the current directory,
// or "" outside one.
func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			first, _, _ := strings.Cut(string(data), "\n")
			if strings.TrimSpace(first) == "module github.com/gatehouse-dev/gatehouse" {
				return dir
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func printImageResult(out io.Writer, res *build.Result) {
	how := "Built"
	if res.Cached {
		how = "From the cache"
	}
	fmt.Fprintf(out, "%s in %s: %s\n", how, res.Elapsed.Round(100*time.Millisecond), res.Dir)
	fmt.Fprintf(out, "  kernel     %s\n  root hash  %s\n", res.KernelVersion, res.RootHash)
	for _, im := range res.Images {
		fmt.Fprintf(out, "  %-12s %s (%d MiB), %s\n", im.Role, filepath.Base(im.Disk), im.Size>>20, filepath.Base(im.UKI))
	}
	fmt.Fprintf(out, "  manifest   %s\n", filepath.Base(res.Manifest))
}
