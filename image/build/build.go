// Package build makes the Gatehouse node image: a Debian 12 (bookworm) root
// file system from Debian's packages with the pinned Kubernetes binaries and
// the bootstrapper baked in, as a read-only squashfs under dm-verity, booted
// by a unified kernel image (systemd-stub, one per role) from the EFI system
// partition of a raw GPT disk (docs/image.md, "How the image is built").
//
// The build has two stages, each cached by content under Options.CacheDir:
// the root file system (debootstrap and apt-get, keyed by the package list,
// suite, mirror and recipe version), and the assembly (keyed by the root
// file system's digest, the baked binaries' digests and the recipe). The
// assembly is reproducible: the same root file system and binaries give
// byte-identical disks.
package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// DefaultMirror is the Debian mirror the root file system comes from.
const DefaultMirror = "http://deb.debian.org/debian"

// Options configure Build.
type Options struct {
	// CacheDir keeps the stages' results and the downloaded .deb files
	// (e.g. $GATEHOUSE_CACHE/image). Required.
	CacheDir string
	// Out, when set, receives a copy of the outputs; they always stay in
	// the cache too.
	Out string
	// KubeBinDir holds the pinned kubelet, kubeadm and kubectl
	// (hack/kube-binaries.sh prints it). Required.
	KubeBinDir string
	// Bootstrapper is a gatehouse-bootstrapper binary to bake in; empty
	// builds one from Source.
	Bootstrapper string
	// Source is the Gatehouse module's root directory the bootstrapper is
	// built from when Bootstrapper is empty.
	Source string
	// Mirror is the Debian mirror; empty is DefaultMirror.
	Mirror string
	// Rebuild assembles the image again even when the cache holds it (the
	// root file system stays cached).
	Rebuild bool
	// Progress receives a line per step with the time since the start;
	// nil discards them.
	Progress io.Writer
}

// Result describes a built image. Every path is absolute.
type Result struct {
	// Dir holds the outputs: the disks, the UKIs and manifest.json.
	Dir string `json:"dir"`
	// Cached says the assembly came from the cache.
	Cached bool `json:"cached"`
	// Manifest is manifest.json: every component with its sha256 digest
	// and origin.
	Manifest string `json:"manifest"`
	// RootHash is the dm-verity root hash of the root file system (64 hex
	// digits), on every image's kernel command line.
	RootHash string `json:"rootHash"`
	// KernelVersion is the kernel's release, e.g. "6.1.0-50-amd64".
	KernelVersion string `json:"kernelVersion"`
	// Images are the per-role images, control plane first.
	Images []Image `json:"images"`
	// Elapsed is how long Build took.
	Elapsed time.Duration `json:"elapsed"`
}

// Image is the image of one role: the same root, a UKI whose command line
// names the role.
type Image struct {
	// Role is "controlPlane" or "worker", the value of gatehouse.role= on
	// the kernel command line.
	Role string `json:"role"`
	// Cmdline is the kernel command line in the UKI's .cmdline section.
	Cmdline string `json:"cmdline"`
	// UKI is the unified kernel image (PE/COFF), the same bytes as
	// \EFI\BOOT\BOOTX64.EFI on the disk's EFI system partition.
	UKI string `json:"uki"`
	// Disk is the raw GPT disk image.
	Disk string `json:"disk"`
	// Size is the disk's size in bytes.
	Size int64 `json:"size"`
}

// Build makes the node image, from the cache where it can. It needs root
// (debootstrap, chroot, mount namespaces) and the programs checkTools names;
// errors name the step that failed.
func Build(ctx context.Context, opts Options) (*Result, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	p := newProgress(opts.Progress)
	if err := checkTools(lookTool, allTools()); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("gatehouse image build needs root: debootstrap, chroot and mount namespaces")
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil { //nolint:gosec // a cache of public artefacts
		return nil, fmt.Errorf("creating the image cache: %w", err)
	}
	unlock, err := lockCache(ctx, opts.CacheDir, p)
	if err != nil {
		return nil, err
	}
	defer unlock()

	var bins []binary
	if err := p.step("Checking the pinned Kubernetes binaries in "+opts.KubeBinDir, func() (err error) {
		bins, err = kubeBinaries(ctx, opts.KubeBinDir)
		return err
	}); err != nil {
		return nil, err
	}
	boot, err := bootstrapperBinary(ctx, p, opts)
	if err != nil {
		return nil, err
	}
	defer boot.cleanup()
	root, err := ensureRootFS(ctx, p, opts.CacheDir, opts.mirror())
	if err != nil {
		return nil, err
	}
	in := assemblyInputs{root: root, kube: bins, bootstrapper: boot.binary}
	key, err := in.key()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(opts.CacheDir, "builds", key)
	res, err := loadResult(dir)
	switch {
	case err == nil && !opts.Rebuild:
		res.Cached = true
		now := time.Now()
		if err := os.Chtimes(dir, now, now); err != nil { // used: pruneBuilds keeps it
			return nil, err
		}
		p.detail("The cache holds this image (root file system %s, recipe %s): %s", short(root.Digest), recipeVersion, dir)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return nil, err
	default:
		if res, err = assembleCached(ctx, p, in, dir); err != nil {
			return nil, err
		}
	}
	if opts.Out != "" {
		if err := p.step("Copying the outputs to "+opts.Out, func() error { return copyOutputs(dir, opts.Out) }); err != nil {
			return nil, err
		}
	}
	res.Elapsed = p.elapsed()
	return res, nil
}

// check checks the options before anything runs; errors name the flag
// of `gatehouse image build` to fix.
func (o Options) check() error {
	switch {
	case o.CacheDir == "":
		return errors.New("--cache-dir: the image cache directory is required")
	case o.KubeBinDir == "":
		return errors.New("the pinned Kubernetes binaries are not found: pass --kube-bin or set GATEHOUSE_KUBE_BIN=$(hack/kube-binaries.sh) (make image does)")
	case o.Bootstrapper == "" && o.Source == "":
		return errors.New("no bootstrapper: run in a Gatehouse checkout (it is built from ./cmd/gatehouse-bootstrapper) or pass --bootstrapper")
	}
	if fi, err := os.Stat(o.KubeBinDir); err != nil || !fi.IsDir() {
		return fmt.Errorf("--kube-bin %s is not a directory: run hack/kube-binaries.sh, which prints the directory of the pinned binaries", o.KubeBinDir)
	}
	if o.Bootstrapper != "" {
		if fi, err := os.Stat(o.Bootstrapper); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("--bootstrapper %s is not a file: give a gatehouse-bootstrapper binary, or leave the flag out to build one", o.Bootstrapper)
		}
	}
	return checkMirror(o.mirror())
}

func (o Options) mirror() string {
	if o.Mirror == "" {
		return DefaultMirror
	}
	return o.Mirror
}

// assembleCached assembles the image into dir through a temporary
// directory beside it, renamed into place once the manifest is written:
// an interrupted build leaves no half image in the cache.
func assembleCached(ctx context.Context, p *progress, in assemblyInputs, dir string) (*Result, error) {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("removing an interrupted assembly: %w", err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil { //nolint:gosec // public artefacts
		return nil, err
	}
	defer os.RemoveAll(tmp) // gone after the rename; only an error path leaves it
	m, err := assembleImage(ctx, p, in, tmp)
	if err != nil {
		return nil, err
	}
	if err := writeManifest(tmp, m); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, fmt.Errorf("moving the image into the cache: %w", err)
	}
	if err := pruneBuilds(filepath.Dir(dir), keepBuilds, time.Now().Add(-keepUsed)); err != nil {
		p.detail("Could not prune old images from the cache: %v", err)
	}
	return resultFromManifest(dir, m), nil
}

// loadResult reads the result of an assembly cached in dir; an error
// satisfying errors.Is(err, os.ErrNotExist) means there is none.
func loadResult(dir string) (*Result, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("reading the cached image's manifest %s: %w", filepath.Join(dir, manifestFile), err)
	}
	return resultFromManifest(dir, &m), nil
}

func resultFromManifest(dir string, m *manifest) *Result {
	r := &Result{Dir: dir, Manifest: filepath.Join(dir, manifestFile), RootHash: m.Root.Verity.RootHash, KernelVersion: m.Kernel.Version}
	for _, im := range m.Images {
		r.Images = append(r.Images, Image{
			Role: im.Role, Cmdline: im.Cmdline,
			UKI: filepath.Join(dir, im.UKI.File), Disk: filepath.Join(dir, im.Disk.File), Size: im.Disk.Size,
		})
	}
	return r
}

// sha256File returns the hex SHA-256 digest of the file at path.
func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// short shortens a hex digest for a progress line.
func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}
