package mini

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/attestation/tpm/swtpm"
	"github.com/gatehouse-dev/gatehouse/mini/images"
)

// bootManifest is what every untampered node measures besides its
// bootstrapper: the cluster's image archive digest and the Kubernetes
// versions whose images it carries (space-separated: the cluster's, then
// those it may be upgraded to). A Kubernetes upgrade inside these does
// not change what a node measures (docs/upgrades.md).
func bootManifest(versions, imagesDigest string) []byte {
	return []byte("gatehouse-mini boot manifest\nkubernetes " + versions + "\nimages sha256:" + imagesDigest + "\n")
}

// nodeImages are the container images every node imports, and what an
// untampered node measures: prepare's product.
type nodeImages struct {
	// archive is the image archive in the cluster directory, pause the
	// pause image's reference in it.
	archive, pause string
	// digest is the archive's sha256 (hex) when it came from the cache;
	// seed the cluster's containerd seed, "" without one.
	digest, seed string
	// manifest is what every node measures besides its bootstrapper.
	manifest []byte
}

// prepare builds the node images (or takes them from the cache) and
// creates the nodes' TPM manufacturer CA, at the same time.
func (u *up) prepare(ctx context.Context) (*nodeImages, swtpm.LocalCA, error) {
	u.p.step("Node images from the pinned binaries (built, or from the cache) and the local TPM manufacturer CA (the nodes' EK certificates chain to it)")
	tpmCA := swtpm.LocalCA{Dir: filepath.Join(u.opts.Dir, "tpm-ca")}
	done := make(chan error, 1)
	// The manufacturer's CA issues every node TPM's EK certificate and
	// the join policy trusts it (ekRoots): nodes join with no key
	// registered beforehand.
	go func() { done <- tpmCA.Init(ctx) }()
	imgs, err := buildImages(ctx, u.opts, u.p)
	return imgs, tpmCA, errors.Join(err, <-done)
}

// buildImages writes the image archive every node imports, or links it
// from the cache, and fixes the boot manifest, which names the archive's
// digest.
func buildImages(ctx context.Context, opts Options, p *progress) (*nodeImages, error) {
	imgs := &nodeImages{archive: filepath.Join(opts.Dir, "images.tar")}
	specs, pause, versions, err := imageSpecs(ctx, opts)
	if err != nil {
		return nil, err
	}
	carried := strings.Join(versions, " ")
	imgs.pause = pause
	if opts.ImageCache == "" {
		if err := images.WriteArchive(imgs.archive, "amd64", specs); err != nil {
			return nil, err
		}
		digest, err := images.FileDigest(imgs.archive)
		if err != nil {
			return nil, err
		}
		imgs.manifest = bootManifest(carried, digest)
		return imgs, nil
	}
	cached, err := images.Cache{Dir: opts.ImageCache}.Archive("amd64", specs)
	if err != nil {
		return nil, fmt.Errorf("node images (cache %s): %w", opts.ImageCache, err)
	}
	how := "built and cached"
	if cached.Hit {
		how = "found in the cache (same binaries)"
	}
	p.detail("node images %s: %s", how, cached.Path)
	// The cluster keeps its own link: the cache may drop the archive
	// while nodes still import it at every boot.
	if err := linkOrCopy(cached.Path, imgs.archive); err != nil {
		return nil, err
	}
	imgs.digest = cached.Digest
	imgs.manifest = bootManifest(carried, cached.Digest)
	// The images imported and unpacked once, kept beside the archive, and
	// the cluster's own copy of that, which its nodes start from.
	seed := strings.TrimSuffix(cached.Path, ".tar") + ".containerd"
	var refs []string
	for _, s := range specs {
		refs = append(refs, s.Ref)
	}
	if err := buildSeed(ctx, cached.Path, refs, seed, latestSeed(opts.ImageCache, seed)); err != nil {
		p.detail("no containerd seed, every node imports the images itself: %v", err)
		return imgs, nil
	}
	imgs.seed = filepath.Join(opts.Dir, "images.containerd")
	if err := linkSeed(seed, imgs.seed); err != nil {
		p.detail("no containerd seed, every node imports the images itself: %v", err)
		imgs.seed = ""
	}
	return imgs, nil
}

// linkOrCopy makes dst a hard link to src, or a copy where src is on
// another file system.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.WriteFunc(dst, 0o644, func(f *os.File) error {
		_, err := io.Copy(f, in)
		return err
	})
}

// kubeBuild is one Kubernetes build whose images the nodes carry.
type kubeBuild struct{ version, dir string }

// kubeBuilds are the cluster's Kubernetes build and the builds it may be
// upgraded to (Options.UpgradeKubeBinDirs), each with the version its
// kubeadm reports.
func kubeBuilds(ctx context.Context, opts Options) ([]kubeBuild, error) {
	builds := []kubeBuild{{opts.KubernetesVersion, opts.KubeBinDir}}
	for _, dir := range opts.UpgradeKubeBinDirs {
		v, err := kubeadmVersion(ctx, dir)
		if err != nil {
			return nil, err
		}
		builds = append(builds, kubeBuild{v, dir})
	}
	return builds, nil
}

// kubeadmVersion is what dir's kubeadm says it is ("v1.36.4").
func kubeadmVersion(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(dir, "kubeadm"), "version", "-o", "short").Output()
	if err != nil {
		return "", fmt.Errorf("asking %s/kubeadm its version: %w", dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// imageSpecs are the specifications of every image kubeadm init and
// kubeadm upgrade need for each build (their add-ons, kube-proxy with
// Debian's iptables and CoreDNS, included), and of the project's
// services; pause is the pause image's reference (the first build's),
// versions the builds' Kubernetes versions.
func imageSpecs(ctx context.Context, opts Options) (specs []images.Spec, pause string, versions []string, err error) {
	builds, err := kubeBuilds(ctx, opts)
	if err != nil {
		return nil, "", nil, err
	}
	seen := map[string]bool{}
	for _, b := range builds {
		versions = append(versions, b.version)
		bs, p, err := buildImageSpecs(ctx, opts, b)
		if err != nil {
			return nil, "", nil, err
		}
		if pause == "" {
			pause = p
		}
		for _, s := range bs {
			if !seen[s.Ref] {
				seen[s.Ref] = true
				specs = append(specs, s)
			}
		}
	}
	for _, svc := range []string{"gatehouse-joinservice", "gatehouse-keyservice"} {
		if opts.Release != nil {
			continue // pulled by digest from the cluster's registry (ReleaseServices.push)
		}
		specs = append(specs, images.Spec{Ref: ImageRepository + "/" + svc + ":local", Files: map[string]string{svc: filepath.Join(opts.BinDir, svc)}})
	}
	return specs, pause, versions, nil
}

// buildImageSpecs are the images kubeadm lists for one build.
func buildImageSpecs(ctx context.Context, opts Options, b kubeBuild) (specs []images.Spec, pause string, err error) {
	out, err := exec.CommandContext(ctx, filepath.Join(b.dir, "kubeadm"), "config", "images", "list",
		"--kubernetes-version", b.version, "--image-repository", ImageRepository).Output()
	if err != nil {
		return nil, "", fmt.Errorf("listing kubeadm's images: %w", err)
	}
	kube := filepath.Join(b.dir, "kube")
	for _, ref := range strings.Fields(string(out)) {
		name := strings.TrimPrefix(ref[:strings.LastIndex(ref, ":")], ImageRepository+"/")
		switch name {
		case "kube-apiserver", "kube-controller-manager", "kube-scheduler":
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"kube": kube}, Links: map[string]string{name: "kube"}})
		case "etcd":
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"etcd": filepath.Join(b.dir, "etcd")}})
		case "kube-proxy":
			// kube-proxy programs the node's iptables (nf_tables backend)
			// with the iptables commands, which load their extensions at
			// run time.
			files := map[string]string{"kube": kube, "xtables-nft-multi": xtablesMulti}
			links := map[string]string{"kube-proxy": "kube"}
			for _, l := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
				links[l] = "xtables-nft-multi"
			}
			specs = append(specs, images.Spec{Ref: ref, Files: files, Links: links, Dirs: []string{xtablesExtensions}})
		case "coredns":
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"coredns": filepath.Join(opts.AddonBinDir, "coredns")},
				Entrypoint: []string{images.BinDir + "/coredns"}})
		case "pause":
			pause = ref
			specs = append(specs, images.Spec{Ref: ref, Files: map[string]string{"pause": filepath.Join(opts.BinDir, "gatehouse-pause")},
				Entrypoint: []string{images.BinDir + "/pause"}})
		}
	}
	if pause == "" {
		return nil, "", fmt.Errorf("kubeadm lists no pause image: %s", out)
	}
	return specs, pause, nil
}

// Debian's iptables (nf_tables backend) and its extensions, which the
// kube-proxy image carries.
const (
	xtablesMulti      = "/usr/sbin/xtables-nft-multi"
	xtablesExtensions = "/usr/lib/x86_64-linux-gnu/xtables"
)
