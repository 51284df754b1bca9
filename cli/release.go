package cli

import (
	"errors"
	"fmt"
	"os"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"
	"helm.sh/helm/v3/pkg/chart"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
	"github.com/gatehouse-dev/gatehouse/internal/release"
	"github.com/gatehouse-dev/gatehouse/mini"
	"github.com/gatehouse-dev/gatehouse/upgrade"
)

func newReleaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Verify a Gatehouse release, or make its signing key (docs/install.md)",
	}
	cmd.AddCommand(newReleaseVerifyCmd(), newReleaseKeygenCmd())
	return cmd
}

func newReleaseVerifyCmd() *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "Check every signature, checksum and image digest of the release in DIR",
		Long: `Checks the release directory DIR (make release; docs/install.md, "Installing
from a release") with the release's public key: SHA256SUMS's signature, every
file's sha256 and cosign signature, each image archive's blobs, index digest
and cosign image signatures, and that each chart runs its image by digest.
A refusal names the artifact.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := loadReleaseKey(key)
			if err != nil {
				return err
			}
			scratch, err := os.MkdirTemp("", "gatehouse-release-verify-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			fmt.Fprintf(cmd.ErrOrStderr(), "Verifying %s (every file is read and hashed)\n", args[0])
			rel, err := release.Verify(cmd.Context(), args[0], v, scratch)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Release %s (commit %s) verified\n", rel.Manifest.Version, rel.Manifest.Commit)
			for _, img := range rel.Manifest.Images {
				fmt.Fprintf(out, "Image:\t%s %s %v\n", img.Name, img.Ref(), img.Platforms)
			}
			for _, c := range rel.Manifest.Charts {
				fmt.Fprintf(out, "Chart:\t%s\n", c.Path)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "the release's public key (PKIX PEM, e.g. release.pub)")
	_ = cmd.MarkFlagRequired("key")
	return cmd
}

// loadReleaseKey reads a release's public key file.
func loadReleaseKey(file string) (*cosignformat.Verifier, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the release key: %w", err)
	}
	v, err := cosignformat.LoadVerifier(pem)
	if err != nil {
		return nil, fmt.Errorf("release key %s: %w", file, err)
	}
	return v, nil
}

func newReleaseKeygenCmd() *cobra.Command {
	var priv, pub string
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Make an Ed25519 release signing key pair (the private key file is created with mode 0600)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			privPEM, pubPEM, err := cosignformat.GenerateKey()
			if err != nil {
				return err
			}
			f, err := os.OpenFile(priv, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("creating the private key file (an existing key is never overwritten): %w", err)
			}
			if _, err := f.Write(privPEM); err != nil {
				return errors.Join(err, f.Close())
			}
			if err := f.Close(); err != nil {
				return err
			}
			if err := os.WriteFile(pub, pubPEM, 0o644); err != nil { //nolint:gosec // a public key
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Private key: %s (keep it offline; make release RELEASE_KEY=%s)\nPublic key: %s (publish it)\n", priv, priv, pub)
			return nil
		},
	}
	cmd.Flags().StringVar(&priv, "private-key", "release.key", "private key file to create")
	cmd.Flags().StringVar(&pub, "public-key", "release.pub", "public key file to create")
	return cmd
}

// releaseFlags name a release directory and its public key, and (for
// upgrade apply) a registry holding copies of its images.
type releaseFlags struct{ dir, key, registry string }

// releaseCharts verifies the release of f and sets opts to upgrade to its
// charts, each pinned to its image by digest (over any image values the
// cluster's releases carry). Nothing in the cluster is touched before
// the whole release verified.
func releaseCharts(cmd *cobra.Command, f releaseFlags, opts *upgrade.Options) error {
	if f.key == "" {
		return errors.New("--release needs --release-key, the release's public key")
	}
	v, err := loadReleaseKey(f.key)
	if err != nil {
		return err
	}
	scratch, err := os.MkdirTemp("", "gatehouse-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	fmt.Fprintf(cmd.ErrOrStderr(), "Verifying the release in %s\n", f.dir)
	rel, err := release.Verify(cmd.Context(), f.dir, v, scratch)
	if err != nil {
		return err
	}
	if opts.Values == nil {
		opts.Values = map[string]map[string]any{}
	}
	for _, name := range opts.Order {
		c, img, err := rel.LoadChart(name)
		if err != nil {
			return err
		}
		opts.Charts[name] = c
		if opts.Values[name] == nil {
			opts.Values[name] = map[string]any{}
		}
		repo := img.Repository
		if f.registry != "" {
			// A copy of the image keeps its digest: the pods still run
			// exactly the verified image, containerd checks it on pull.
			repo = f.registry + "/" + img.Name
		}
		opts.Values[name]["image"] = map[string]any{"repository": repo, "digest": img.Digest}
		fmt.Fprintf(cmd.ErrOrStderr(), "Chart %s %s runs %s@%s\n", name, c.Metadata.Version, repo, img.Digest)
	}
	return nil
}

// releaseServices verifies the release of f and returns its join and key
// services for the local cluster: the charts loaded from the verified
// bytes, the image indexes of the verified archives (read from the
// scratch directory cleanup removes, once the cluster is up). Nothing is
// loaded before the whole release verified.
func releaseServices(cmd *cobra.Command, f releaseFlags) (*mini.ReleaseServices, func(), error) {
	if f.key == "" {
		return nil, nil, errors.New("--release needs --release-key, the release's public key")
	}
	v, err := loadReleaseKey(f.key)
	if err != nil {
		return nil, nil, err
	}
	scratch, err := os.MkdirTemp("", "gatehouse-release-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(scratch) }
	fail := func(err error) (*mini.ReleaseServices, func(), error) {
		cleanup()
		return nil, nil, err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "Verifying the release in %s\n", f.dir)
	rel, err := release.Verify(cmd.Context(), f.dir, v, scratch)
	if err != nil {
		return fail(err)
	}
	services := &mini.ReleaseServices{Version: rel.Manifest.Version, Images: map[string]v1.ImageIndex{}, Charts: map[string]*chart.Chart{}}
	for _, name := range charts.Names {
		c, img, err := rel.LoadChart(name)
		if err != nil {
			return fail(err)
		}
		vi := rel.Images[img.Name]
		if !slices.Contains(img.Platforms, "linux/amd64") {
			return fail(fmt.Errorf("the release's image %s has no linux/amd64 manifest, which the local cluster runs", img.Ref()))
		}
		services.Charts[name] = c
		services.Images[name] = vi.Index
		fmt.Fprintf(cmd.ErrOrStderr(), "Chart %s %s runs %s\n", name, c.Metadata.Version, img.Ref())
	}
	return services, cleanup, nil
}
