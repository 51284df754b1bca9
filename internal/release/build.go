package release

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
)

// ImageSpec is a container image of the release: the image's name (its
// repository under Config.Registry) and the Command whose binary it runs.
type ImageSpec struct {
	Name    string
	Command string
}

// ChartSpec is a chart of the release: its directory under charts/ and
// the image (an ImageSpec's Name) it runs.
type ChartSpec struct {
	Name  string
	Image string
}

// Config is what a release is built from. The same Config over the same
// checkout, Go toolchain and Debian C toolchains and glibc (for the cgo
// binaries: the build machine's gcc and libc6-dev for its architecture,
// Debian's cross gcc and libc6-*-cross for the others) gives the same
// bytes.
type Config struct {
	// Version is the release's version, vMAJOR.MINOR.PATCH.
	Version string
	// Commit is the git commit, compiled into the binaries.
	Commit string
	// RepoDir is the module's root: the Go packages, charts/ and
	// config/clusterctl/ are read from it.
	RepoDir string
	// OutDir is the release directory; it must not exist or be empty.
	OutDir string
	// Registry is where the images are pushed, e.g. ghcr.io/gatehouse-dev:
	// the images' repositories are Registry/<name>, and the signatures
	// name them.
	Registry string
	// Arches are the Linux architectures built, e.g. amd64 and arm64.
	Arches []string
	// Commands are the binaries built for each architecture. Those run by
	// Images are built first; the others get the images' digests
	// (internal/buildinfo), so `gatehouse version` prints them.
	Commands []Command
	// Images are the container images, one multi-arch index each.
	Images []ImageSpec
	// Charts are the Helm charts packaged with their image's digest.
	Charts []ChartSpec
	// ClusterctlImage is the image the clusterctl components run.
	ClusterctlImage string
	// NodeImageDir, if set, is a node image directory (hack/node-image.sh)
	// whose files the release holds.
	NodeImageDir string
	// Signer signs every artifact (an Ed25519 key: deterministic).
	Signer *cosignformat.Signer
	// Epoch is every timestamp in the artifacts (the commit's time).
	Epoch time.Time
	// Log receives progress.
	Log *slog.Logger
}

// builder is one Build's state: the manifest it fills, the artifacts
// whose SBOMs are written.
type builder struct {
	cfg     Config
	scratch string
	m       Manifest
	// cgo are the commands built with cgo, each with the cgo packages it
	// needs; toolchains their C toolchains by architecture (checkCgo).
	cgo        map[string][]string
	toolchains map[string]cToolchain
}

// Build writes the release of cfg into cfg.OutDir and returns its
// manifest. On error the partial directory is left for inspection.
func Build(ctx context.Context, cfg Config) (*Manifest, error) {
	if err := checkVersion(cfg.Version); err != nil {
		return nil, err
	}
	if cfg.Signer == nil {
		return nil, errors.New("a signing key is needed")
	}
	if entries, err := os.ReadDir(cfg.OutDir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("release directory %s is not empty: remove it first", cfg.OutDir)
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil { //nolint:gosec // a release is public
		return nil, err
	}
	scratch, err := os.MkdirTemp(filepath.Dir(filepath.Clean(cfg.OutDir)), ".release-scratch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	b := &builder{cfg: cfg, scratch: scratch, m: Manifest{Version: cfg.Version, Commit: cfg.Commit}}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"checking the C toolchains of the cgo binaries", b.checkCgo},
		{"binaries run by the images", func(ctx context.Context) error { return b.binaries(ctx, true, nil) }},
		{"images", b.images},
		{"the other binaries, with the images' digests", func(ctx context.Context) error { return b.binaries(ctx, false, b.imageRefs()) }},
		{"charts", b.charts},
		{"clusterctl files", b.clusterctl},
		{"node image", b.nodeImage},
		{"manifest, checksums and signatures", b.finish},
	}
	for i, s := range steps {
		cfg.Log.Info("Release", "step", fmt.Sprintf("%d/%d", i+1, len(steps)), "doing", s.name)
		if err := s.run(ctx); err != nil {
			return nil, fmt.Errorf("release %s, %s: %w", cfg.Version, s.name, err)
		}
	}
	return &b.m, nil
}

func (b *builder) imageCommands() []string {
	var cmds []string
	for _, i := range b.cfg.Images {
		cmds = append(cmds, i.Command)
	}
	return cmds
}

func (b *builder) imageRefs() []string {
	var refs []string
	for _, i := range b.m.Images {
		refs = append(refs, i.Name+"="+i.Ref())
	}
	return refs
}

// checkCgo finds the commands that need cgo and checks, before anything
// is built, that each architecture's C toolchain is installed: a missing
// one fails the release, naming its Debian packages (cToolchain.check).
func (b *builder) checkCgo(ctx context.Context) error {
	g := goBuilder{dir: b.cfg.RepoDir}
	b.cgo = map[string][]string{}
	for _, c := range b.cfg.Commands {
		pkgs, err := g.needsCgo(ctx, c.Package)
		if err != nil {
			return err
		}
		if len(pkgs) > 0 {
			b.cgo[c.Name] = pkgs
		}
	}
	if len(b.cgo) == 0 {
		return nil
	}
	b.toolchains = map[string]cToolchain{}
	var errs []error
	for _, arch := range b.cfg.Arches {
		tc, err := toolchainFor(arch, runtime.GOARCH)
		if err == nil {
			err = tc.check()
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b.toolchains[arch] = tc
		b.cfg.Log.Info("Release", "platform", "linux/"+arch, "cc", tc.cc, "libraries", strings.Join(tc.libDirs, ":"))
	}
	if len(errs) > 0 {
		var names, pkgs []string
		for n, p := range b.cgo {
			names = append(names, n)
			pkgs = append(pkgs, p...)
		}
		slices.Sort(names)
		slices.Sort(pkgs)
		return fmt.Errorf("%s use cgo (%s): %w", strings.Join(names, ", "), strings.Join(slices.Compact(pkgs), ", "), errors.Join(errs...))
	}
	return nil
}

// binaries builds the commands that images run (inImages) or the others,
// for every architecture, with an SBOM each.
func (b *builder) binaries(ctx context.Context, inImages bool, images []string) error {
	g := goBuilder{dir: b.cfg.RepoDir, version: b.cfg.Version, commit: b.cfg.Commit}
	for _, arch := range b.cfg.Arches {
		for _, c := range b.cfg.Commands {
			if slices.Contains(b.imageCommands(), c.Name) != inImages {
				continue
			}
			rel := filepath.Join(binDir, "linux-"+arch, c.Name)
			out := filepath.Join(b.cfg.OutDir, rel)
			b.cfg.Log.Info("Release", "building", rel)
			var tc *cToolchain
			if _, ok := b.cgo[c.Name]; ok {
				t := b.toolchains[arch]
				tc = &t
			}
			if err := g.build(ctx, c, arch, tc, out, images); err != nil {
				return err
			}
			platform := "linux/" + arch
			b.m.Binaries = append(b.m.Binaries, Binary{Name: c.Name, Platform: platform, Path: filepath.ToSlash(rel)})
			comp, err := goComponent(c.Name, b.cfg.Version, out)
			if err != nil {
				return err
			}
			sum := (*comp.Hashes)[0].Value
			comp.Properties = &[]cdx.Property{{Name: "platform", Value: platform}}
			// The modules are the SBOM's components, once: a bom-ref is unique.
			modules := *comp.Components
			comp.Components = nil
			if err := writeSBOM(out+sbomSuffix, comp, sum, modules); err != nil {
				return err
			}
		}
	}
	return nil
}

// binary is the path of a built binary, or "" when it was not built.
func (b *builder) binary(name, arch string) string {
	for _, bin := range b.m.Binaries {
		if bin.Name == name && bin.Platform == "linux/"+arch {
			return filepath.Join(b.cfg.OutDir, filepath.FromSlash(bin.Path))
		}
	}
	return ""
}

// images builds each image for every architecture, as a signed OCI
// layout archive with an SBOM.
func (b *builder) images(ctx context.Context) error {
	for _, spec := range b.cfg.Images {
		repo := b.cfg.Registry + "/" + spec.Name
		imgs := map[string]v1.Image{}
		var comps []cdx.Component
		var platforms []string
		for _, arch := range b.cfg.Arches {
			bin := b.binary(spec.Command, arch)
			if bin == "" {
				return fmt.Errorf("image %s: its binary %s was not built for linux/%s", spec.Name, spec.Command, arch)
			}
			files, err := b.imageFiles(ctx, spec.Command, arch, bin)
			if err != nil {
				return fmt.Errorf("image %s for linux/%s: %w", spec.Name, arch, err)
			}
			img, err := buildImage(b.scratch, spec.Command, arch, files, b.cfg.Epoch)
			if err != nil {
				return fmt.Errorf("image %s for linux/%s: %w", spec.Name, arch, err)
			}
			imgs[arch] = img
			platforms = append(platforms, "linux/"+arch)
			c, err := b.imagePlatformComponent(spec, arch, img, files)
			if err != nil {
				return err
			}
			comps = append(comps, c)
		}
		idx, err := imageIndex(imgs)
		if err != nil {
			return err
		}
		digest, err := idx.Digest()
		if err != nil {
			return err
		}
		rel := archivePath(spec.Name)
		out := filepath.Join(b.cfg.OutDir, rel)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil { //nolint:gosec // a release is public
			return err
		}
		b.cfg.Log.Info("Release", "writing", rel, "digest", digest.String())
		if err := writeImageArchive(out, b.scratch, idx, repo, b.cfg.Version, b.cfg.Signer, b.cfg.Epoch); err != nil {
			return fmt.Errorf("image %s: %w", spec.Name, err)
		}
		img := Image{Name: spec.Name, Repository: repo, Digest: digest.String(), Platforms: platforms, Path: filepath.ToSlash(rel)}
		b.m.Images = append(b.m.Images, img)
		if err := writeSBOM(out+sbomSuffix, imageComponent(img), digest.Hex, comps); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// imagePlatformComponent is an image's SBOM entry for one platform: the
// manifest by digest, with its binary's Go modules and its files; the
// files a Debian package installed (a cgo binary's loader and libraries)
// nested in that package (purl pkg:deb/debian/…).
func (b *builder) imagePlatformComponent(spec ImageSpec, arch string, img v1.Image, files []imageFile) (cdx.Component, error) {
	d, err := img.Digest()
	if err != nil {
		return cdx.Component{}, err
	}
	var listed []sbomFile
	byPackage := map[debPackage][]sbomFile{}
	for _, f := range files {
		sum, err := fileSHA256(f.src)
		if err != nil {
			return cdx.Component{}, err
		}
		sf := sbomFile{Name: "/" + f.name, SHA256: sum}
		if f.deb == (debPackage{}) {
			listed = append(listed, sf)
		} else {
			byPackage[f.deb] = append(byPackage[f.deb], sf)
		}
	}
	goc, err := goComponent(spec.Command, b.cfg.Version, b.binary(spec.Command, arch))
	if err != nil {
		return cdx.Component{}, err
	}
	nested := append([]cdx.Component{goc}, fileComponents(listed)...)
	debs := make([]debPackage, 0, len(byPackage))
	for deb := range byPackage {
		debs = append(debs, deb)
	}
	slices.SortFunc(debs, func(a, b debPackage) int { return strings.Compare(a.purl(), b.purl()) })
	for _, deb := range debs {
		fs := fileComponents(byPackage[deb])
		nested = append(nested, cdx.Component{Type: cdx.ComponentTypeLibrary, Name: deb.Name, Version: deb.Version,
			PackageURL: deb.purl(), BOMRef: deb.purl(), Components: &fs})
	}
	for i := range nested {
		prefixRefs(&nested[i], arch+":")
	}
	return cdx.Component{Type: cdx.ComponentTypeContainer, Name: b.cfg.Registry + "/" + spec.Name, Version: d.String(),
		BOMRef:     arch + ":" + d.String(),
		Properties: &[]cdx.Property{{Name: "platform", Value: "linux/" + arch}},
		Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: d.Hex}},
		Components: &nested}, nil
}

// prefixRefs makes c's and its nested components' BOM references unique
// within an SBOM listing several platforms.
func prefixRefs(c *cdx.Component, prefix string) {
	c.BOMRef = prefix + c.BOMRef
	if c.Components != nil {
		for i := range *c.Components {
			prefixRefs(&(*c.Components)[i], prefix)
		}
	}
}

// charts packages each chart with its image's repository and digest.
func (b *builder) charts(context.Context) error {
	for _, spec := range b.cfg.Charts {
		img, ok := b.m.Image(spec.Image)
		if !ok {
			return fmt.Errorf("chart %s runs image %s, which the release does not build", spec.Name, spec.Image)
		}
		rel := chartPath(spec.Name, b.cfg.Version)
		out := filepath.Join(b.cfg.OutDir, rel)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil { //nolint:gosec // a release is public
			return err
		}
		if err := packageChart(filepath.Join(b.cfg.RepoDir, "charts", spec.Name), spec.Name, b.cfg.Version, img.Repository, img.Digest, out, b.cfg.Epoch); err != nil {
			return err
		}
		b.m.Charts = append(b.m.Charts, Chart{Name: spec.Name, Path: filepath.ToSlash(rel), Images: []string{img.Ref()}})
		sum, err := fileSHA256(out)
		if err != nil {
			return err
		}
		subject := cdx.Component{Type: cdx.ComponentTypeApplication, Name: spec.Name, Version: chartVersion(b.cfg.Version),
			PackageURL: "pkg:helm/" + spec.Name + "@" + chartVersion(b.cfg.Version)}
		if err := writeSBOM(out+sbomSuffix, subject, sum, []cdx.Component{imageComponent(img)}); err != nil {
			return err
		}
	}
	return nil
}

// clusterctl writes the clusterctl repository files with the manager's
// image by digest, and their SBOM.
func (b *builder) clusterctl(context.Context) error {
	img, ok := b.m.Image(b.cfg.ClusterctlImage)
	if !ok {
		return fmt.Errorf("the clusterctl files run image %s, which the release does not build", b.cfg.ClusterctlImage)
	}
	files, err := clusterctlFiles(filepath.Join(b.cfg.RepoDir, "config", "clusterctl"), b.cfg.Version, img.Ref())
	if err != nil {
		return err
	}
	var listed []sbomFile
	for _, name := range []string{clusterctlMetadata, clusterctlComponents} {
		rel := filepath.Join(clusterctlDir, name)
		out := filepath.Join(b.cfg.OutDir, rel)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil { //nolint:gosec // a release is public
			return err
		}
		if err := atomicfile.Write(out, files[name], 0o644); err != nil {
			return err
		}
		b.m.Clusterctl = append(b.m.Clusterctl, filepath.ToSlash(rel))
		sum, err := fileSHA256(out)
		if err != nil {
			return err
		}
		listed = append(listed, sbomFile{Name: name, SHA256: sum})
	}
	return b.directorySBOM(clusterctlDir, "gatehouse-capi-bootstrap-clusterctl", listed, []cdx.Component{imageComponent(img)})
}

// directorySBOM writes <dir>.cdx.json for an artifact made of files.
func (b *builder) directorySBOM(dir, name string, files []sbomFile, more []cdx.Component) error {
	var all strings.Builder
	for _, f := range files {
		all.WriteString(f.SHA256 + "  " + f.Name + "\n")
	}
	sum := sha256Hex([]byte(all.String()))
	subject := cdx.Component{Type: cdx.ComponentTypeApplication, Name: name, Version: b.cfg.Version}
	return writeSBOM(filepath.Join(b.cfg.OutDir, dir+sbomSuffix), subject, sum, append(fileComponents(files), more...))
}

// nodeImage copies the node image's regular files, if one is given.
func (b *builder) nodeImage(context.Context) error {
	if b.cfg.NodeImageDir == "" {
		b.cfg.Log.Warn("Release: no node image given (NODE_IMAGE): the release holds none")
		return nil
	}
	entries, err := os.ReadDir(b.cfg.NodeImageDir)
	if err != nil {
		return fmt.Errorf("reading the node image: %w", err)
	}
	var listed []sbomFile
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		rel := filepath.Join(nodeImageDir, e.Name())
		out := filepath.Join(b.cfg.OutDir, rel)
		if err := copyFile(filepath.Join(b.cfg.NodeImageDir, e.Name()), out); err != nil {
			return err
		}
		b.m.NodeImage = append(b.m.NodeImage, filepath.ToSlash(rel))
		sum, err := fileSHA256(out)
		if err != nil {
			return err
		}
		listed = append(listed, sbomFile{Name: e.Name(), SHA256: sum})
	}
	if len(listed) == 0 {
		return fmt.Errorf("the node image directory %s holds no files", b.cfg.NodeImageDir)
	}
	return b.directorySBOM(nodeImageDir, "gatehouse-node-image", listed, nil)
}

// finish writes release.json, SHA256SUMS and every signature.
func (b *builder) finish(context.Context) error {
	data, err := json.MarshalIndent(b.m, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(b.cfg.OutDir, manifestFile), append(data, '\n'), 0o644); err != nil {
		return err
	}
	files, err := listFiles(b.cfg.OutDir)
	if err != nil {
		return err
	}
	sums, err := checksums(b.cfg.OutDir, files)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(b.cfg.OutDir, checksumsFile), sums, 0o644); err != nil {
		return err
	}
	for _, f := range append(files, checksumsFile) {
		if err := signFile(b.cfg.Signer, filepath.Join(b.cfg.OutDir, filepath.FromSlash(f))); err != nil {
			return fmt.Errorf("signing %s: %w", f, err)
		}
	}
	return nil
}

// signFile writes file's cosign blob signature to file.sig.
func signFile(s *cosignformat.Signer, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	sig, err := s.SignBlob(f)
	if err != nil {
		return err
	}
	return atomicfile.Write(file+cosignformat.SignatureSuffix, sig, 0o644)
}

// DefaultArches are the architectures a release is built for, whatever
// the build machine's: the cgo binaries for the other one are
// cross-compiled (cToolchain).
func DefaultArches() []string { return []string{"amd64", "arm64"} }
