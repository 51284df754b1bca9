package build

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// parts are the inputs of the reproducible assembly: the configured and
// stripped root tree, the kernel, the initrd, systemd-stub and the
// os-release that goes into the UKI.
type parts struct {
	tree, kernel, initrd, stub, osRelease string
	// epoch is SOURCE_DATE_EPOCH: every time stamp written.
	epoch int64
}

// assembled is what assembleParts made.
type assembled struct {
	layout   layout
	verity   *verity
	squashfs component
	hashTree component
	images   []imageInfo
}

// assembleParts makes the root squashfs and its dm-verity hash tree in
// work, then for each role the UKI and the raw disk in out. The same parts
// give byte-identical outputs.
func assembleParts(ctx context.Context, p *progress, in parts, work, out string) (*assembled, error) {
	sq, ht := filepath.Join(work, "root.squashfs"), filepath.Join(work, "root.verity")
	a := &assembled{}
	if err := p.step("Squashfs: the root file system (zstd, time stamps "+strconv.FormatInt(in.epoch, 10)+")", func() error {
		_, err := run(ctx, command{}, "mksquashfs", squashfsArgs(in.tree, sq, in.epoch)...)
		return err
	}); err != nil {
		return nil, err
	}
	if err := p.step("Verity: the root's dm-verity hash tree and root hash", func() (err error) {
		a.verity, err = formatVerity(ctx, sq, ht)
		return err
	}); err != nil {
		return nil, err
	}
	var err error
	if a.squashfs, err = describeComponent(sq, "mksquashfs "+strings.Join(squashfsArgs("<tree>", "<out>", in.epoch)[2:], " ")); err != nil {
		return nil, err
	}
	if a.hashTree, err = describeComponent(ht, "veritysetup format --hash=sha256, salt and UUID derived from the squashfs"); err != nil {
		return nil, err
	}
	p.detail("Root: squashfs %d MiB, hash tree %d KiB, root hash %s", a.squashfs.Size/mib, a.hashTree.Size/1024, a.verity.RootHash)
	rootHash, err := hex.DecodeString(a.verity.RootHash)
	if err != nil {
		return nil, err
	}
	a.layout = newLayout(rootHash, a.squashfs.Size, a.hashTree.Size)
	for _, role := range roles() {
		im, err := assembleRole(ctx, p, in, a, role, work, out)
		if err != nil {
			return nil, err
		}
		a.images = append(a.images, *im)
	}
	return a, nil
}

// assembleRole makes the UKI and the disk of role.
func assembleRole(ctx context.Context, p *progress, in parts, a *assembled, role, work, out string) (*imageInfo, error) {
	im := &imageInfo{Role: role, Cmdline: cmdline(a.verity.RootHash, a.layout, role)}
	ukiName, diskName := "uki-"+fileRole(role)+".efi", "node-"+fileRole(role)+".raw"
	cmdlineFile := filepath.Join(work, "cmdline-"+fileRole(role))
	if err := os.WriteFile(cmdlineFile, []byte(im.Cmdline), 0o644); err != nil { //nolint:gosec // public
		return nil, err
	}
	if err := p.step("UKI ("+role+"): systemd-stub with os-release, command line, kernel and initrd → "+ukiName, func() error {
		return makeUKI(ctx, in.stub, in.osRelease, cmdlineFile, in.kernel, in.initrd, filepath.Join(out, ukiName))
	}); err != nil {
		return nil, err
	}
	esp := filepath.Join(work, "esp-"+fileRole(role)+".img")
	rootHash, _ := hex.DecodeString(a.verity.RootHash)
	if err := p.step("Disk ("+role+"): GPT with the EFI system partition, root and verity partitions → "+diskName, func() error {
		if err := makeESP(ctx, esp, filepath.Join(out, ukiName), fatVolumeID(rootHash), in.epoch); err != nil {
			return err
		}
		return writeDisk(ctx, filepath.Join(out, diskName), a.layout, map[string]string{
			a.layout.esp.name: esp, a.layout.root.name: filepath.Join(work, "root.squashfs"), a.layout.verity.name: filepath.Join(work, "root.verity"),
		})
	}); err != nil {
		return nil, err
	}
	var err error
	if im.UKI, err = describeFile(out, ukiName); err != nil {
		return nil, err
	}
	if im.Disk, err = describeFile(out, diskName); err != nil {
		return nil, err
	}
	return im, os.Remove(esp)
}

// assembleImage makes the node image from in into out: a copy of the
// cached root file system is configured (configure), gets its initrd and
// is stripped, then assembleParts makes the root, UKIs and disks. It
// returns the manifest.
func assembleImage(ctx context.Context, p *progress, in assemblyInputs, out string) (*manifest, error) {
	work := filepath.Join(out, "work")
	defer os.RemoveAll(work) // best effort; the directory is the build's
	tree := filepath.Join(work, "tree")
	if err := os.MkdirAll(work, 0o755); err != nil { //nolint:gosec // public artefacts
		return nil, err
	}
	if err := p.step("Copying the root file system "+short(in.root.Digest), func() error {
		_, err := run(ctx, command{}, "cp", "-a", "--", in.root.Dir, tree)
		return err
	}); err != nil {
		return nil, err
	}
	kver, err := kernelVersion(tree)
	if err != nil {
		return nil, err
	}
	bins := append(append([]binary(nil), in.kube...), in.bootstrapper)
	if err := p.step("Configuring: units, containerd, networkd, read-only root; kubelet, kubeadm, kubectl and the bootstrapper", func() error {
		return configure(ctx, tree, bins)
	}); err != nil {
		return nil, err
	}
	if err := p.step("Initramfs: mkinitramfs "+kver+" with the dm-verity hook", func() error {
		return makeInitrd(ctx, tree, kver, in.root.SourceDateEpoch)
	}); err != nil {
		return nil, err
	}
	pkgBins, err := packageBinaries(tree, in.root.Packages)
	if err != nil {
		return nil, err
	}
	pp := parts{
		tree: tree, kernel: filepath.Join(work, "vmlinuz"), initrd: filepath.Join(work, "initrd.img"),
		stub: filepath.Join(work, "linuxx64.efi.stub"), osRelease: filepath.Join(work, "os-release"), epoch: in.root.SourceDateEpoch,
	}
	for src, dst := range map[string]string{
		"boot/vmlinuz-" + kver: pp.kernel, "boot/initrd.img-" + kver: pp.initrd,
		"usr/lib/systemd/boot/efi/linuxx64.efi.stub": pp.stub, "usr/lib/os-release": pp.osRelease,
	} {
		if err := copyFile(filepath.Join(tree, src), dst, 0o644); err != nil {
			return nil, err
		}
	}
	if err := p.step("Stripping documentation, manual pages, translations and kernel modules a node does not need", func() error {
		if err := strip(tree, kver); err != nil {
			return err
		}
		_, err := inChroot(ctx, tree, "", nil, "depmod", "-a", kver)
		return err
	}); err != nil {
		return nil, err
	}
	a, err := assembleParts(ctx, p, pp, work, out)
	if err != nil {
		return nil, err
	}
	return newManifest(in, kver, pp, a, append(bins, pkgBins...))
}

// newManifest describes the assembled image.
func newManifest(in assemblyInputs, kver string, pp parts, a *assembled, bins []binary) (*manifest, error) {
	m := &manifest{
		Schema: manifestSchema, Recipe: recipeVersion, Suite: in.root.Suite, Mirror: in.root.Mirror,
		SourceDateEpoch: in.root.SourceDateEpoch, RootFSDigest: in.root.Digest,
		Root:   rootInfo{SquashFS: a.squashfs, Verity: *a.verity, HashTree: a.hashTree},
		Images: a.images, Binaries: bins, Packages: in.root.Packages, Partitions: partitionsOf(a.layout),
	}
	pkgs := in.root.Packages
	var err error
	m.Kernel.Version = kver
	if m.Kernel.component, err = describeComponent(pp.kernel, "/boot/vmlinuz-"+kver+" of "+packageOf(pkgs, "linux-image-"+kver)); err != nil {
		return nil, err
	}
	if m.Initrd, err = describeComponent(pp.initrd, "mkinitramfs of "+packageOf(pkgs, "initramfs-tools")+" with the recipe's gatehouse-verity hook and script"); err != nil {
		return nil, err
	}
	if m.Stub, err = describeComponent(pp.stub, "/usr/lib/systemd/boot/efi/linuxx64.efi.stub of "+packageOf(pkgs, "systemd-boot-efi")); err != nil {
		return nil, err
	}
	if m.OSRelease, err = describeComponent(pp.osRelease, "/usr/lib/os-release of "+packageOf(pkgs, "base-files")+" with IMAGE_ID and IMAGE_VERSION"); err != nil {
		return nil, err
	}
	return m, nil
}

// packageOf names the installed package name with its version.
func packageOf(pkgs []debPackage, name string) string {
	for _, p := range pkgs {
		if p.Name == name {
			return "Debian package " + p.Name + " " + p.Version
		}
	}
	return "Debian package " + name
}

// packageBinaries describes the container runtime's programs, which come
// from Debian's packages.
func packageBinaries(tree string, pkgs []debPackage) ([]binary, error) {
	var out []binary
	for _, b := range []struct{ name, path, pkg string }{
		{"containerd", "/usr/bin/containerd", "containerd"},
		{"containerd-shim-runc-v2", "/usr/bin/containerd-shim-runc-v2", "containerd"},
		{"runc", "/usr/sbin/runc", "runc"},
	} {
		sum, err := sha256File(filepath.Join(tree, b.path))
		if err != nil {
			return nil, err
		}
		out = append(out, binary{Name: b.name, Path: b.path, SHA256: sum, Origin: packageOf(pkgs, b.pkg)})
	}
	return out, nil
}

// kernelVersion returns the release of the one kernel installed in tree.
func kernelVersion(tree string) (string, error) {
	entries, err := os.ReadDir(filepath.Join(tree, "usr/lib/modules"))
	if err != nil {
		return "", fmt.Errorf("finding the kernel: %w", err)
	}
	var found []string
	for _, e := range entries {
		if e.IsDir() {
			found = append(found, e.Name())
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("want one kernel in /usr/lib/modules, found %d: %s", len(found), strings.Join(found, ", "))
	}
	return found[0], nil
}

// makeInitrd makes the initrd of kernel kver in tree with initramfs-tools'
// mkinitramfs in a chroot (reproducible with SOURCE_DATE_EPOCH), and
// checks that it holds what opens the dm-verity root.
func makeInitrd(ctx context.Context, tree, kver string, epoch int64) error {
	initrd := "/boot/initrd.img-" + kver
	if err := os.Remove(filepath.Join(tree, initrd)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	env := []string{"SOURCE_DATE_EPOCH=" + strconv.FormatInt(epoch, 10)}
	if _, err := inChroot(ctx, tree, "", env, "mkinitramfs", "-o", initrd, kver); err != nil {
		return err
	}
	list, err := inChroot(ctx, tree, "", nil, "lsinitramfs", initrd)
	if err != nil {
		return err
	}
	for _, want := range []string{"scripts/local-top/gatehouse-verity", "usr/sbin/veritysetup", "/dm-verity.ko", "/squashfs.ko", "/virtio_blk.ko"} {
		if !strings.Contains(string(list), want) {
			return fmt.Errorf("the initrd lacks %s", want)
		}
	}
	return nil
}
