// Command release builds Gatehouse's release artifacts (make release
// VERSION=vX.Y.Z; docs/development.md, "Releases") with internal/release:
// binaries for linux/amd64 and linux/arm64, the service images as signed
// OCI layout archives, the charts by image digest, the clusterctl files,
// the node image, an SBOM per artifact, SHA256SUMS and cosign signatures.
//
//	release -version v0.2.0 -commit <sha> -epoch <unix seconds> -key release.key -out _output/release/v0.2.0 [-node-image DIR]
//
// The private key (gatehouse release keygen, or openssl: docs/install.md,
// "Signed artifacts") is an input by path; the key itself is never printed.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
	"github.com/gatehouse-dev/gatehouse/internal/release"
)

// The release's contents: every ./cmd binary; the images the charts and
// the clusterctl files run.
var (
	commands = []release.Command{
		{Name: "gatehouse", Package: "./cmd/gatehouse"},
		{Name: "gatehouse-bootstrapper", Package: "./cmd/gatehouse-bootstrapper"},
		{Name: "gatehouse-capi-bootstrap", Package: "./cmd/gatehouse-capi-bootstrap"},
		{Name: "gatehouse-joinservice", Package: "./cmd/gatehouse-joinservice"},
		{Name: "gatehouse-keyservice", Package: "./cmd/gatehouse-keyservice"},
		{Name: "gatehouse-pause", Package: "./cmd/gatehouse-pause"},
	}
	images = []release.ImageSpec{
		{Name: "gatehouse-capi-bootstrap", Command: "gatehouse-capi-bootstrap"},
		{Name: "gatehouse-joinservice", Command: "gatehouse-joinservice"},
		{Name: "gatehouse-keyservice", Command: "gatehouse-keyservice"},
	}
	charts = []release.ChartSpec{
		{Name: "gatehouse-joinservice", Image: "gatehouse-joinservice"},
		{Name: "gatehouse-keyservice", Image: "gatehouse-keyservice"},
	}
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return build(ctx, slog.New(slog.NewTextHandler(os.Stderr, nil)), os.Args[1:])
}

// flags are the build's inputs.
type flags struct {
	version, commit, out, key, nodeImage, registry, arches, repo string
	epoch                                                        int64
}

func parse(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.StringVar(&f.version, "version", "", "release version, vMAJOR.MINOR.PATCH (required)")
	fs.StringVar(&f.commit, "commit", "", "git commit the release is built from (required)")
	fs.Int64Var(&f.epoch, "epoch", 0, "every artifact's timestamp, Unix seconds (the commit's time: git log -1 --format=%ct)")
	fs.StringVar(&f.out, "out", "", "release directory, absent or empty (required)")
	fs.StringVar(&f.key, "key", "", "Ed25519 private key file, PKCS#8 PEM (required; never printed)")
	fs.StringVar(&f.nodeImage, "node-image", "", "node image directory (hack/node-image.sh prints it); none when empty")
	fs.StringVar(&f.registry, "registry", "ghcr.io/gatehouse-dev", "registry and path the images are pushed to")
	fs.StringVar(&f.arches, "arch", strings.Join(release.DefaultArches(), ","), "comma-separated Linux architectures")
	fs.StringVar(&f.repo, "repo", ".", "the repository's root")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	for name, v := range map[string]string{"-version": f.version, "-commit": f.commit, "-out": f.out, "-key": f.key} {
		if v == "" {
			return f, fmt.Errorf("%s is required", name)
		}
	}
	return f, nil
}

// config is the release's Config for f, with signer.
func config(f flags, signer *cosignformat.Signer, log *slog.Logger) release.Config {
	return release.Config{
		Version: f.version, Commit: f.commit, RepoDir: f.repo, OutDir: f.out, Registry: f.registry,
		Arches: strings.Split(f.arches, ","), Commands: commands, Images: images, Charts: charts,
		ClusterctlImage: "gatehouse-capi-bootstrap", NodeImageDir: f.nodeImage,
		Signer: signer, Epoch: time.Unix(f.epoch, 0).UTC(), Log: log,
	}
}

func build(ctx context.Context, log *slog.Logger, args []string) error {
	f, err := parse(args)
	if err != nil {
		return err
	}
	pem, err := os.ReadFile(f.key)
	if err != nil {
		return fmt.Errorf("reading the signing key: %w", err)
	}
	signer, err := cosignformat.LoadSigner(pem)
	if err != nil {
		return err
	}
	start := time.Now()
	m, err := release.Build(ctx, config(f, signer, log))
	if err != nil {
		return err
	}
	log.Info("Release built", "version", m.Version, "dir", f.out, "images", len(m.Images), "binaries", len(m.Binaries),
		"took", time.Since(start).Round(time.Second).String())
	return nil
}
