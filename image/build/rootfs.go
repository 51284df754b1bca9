package build

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// suite is the Debian release of the image.
const suite = "bookworm"

// packages are installed with apt-get --no-install-recommends on top of
// debootstrap's minbase variant: the kernel and an initrd that opens the
// dm-verity root, systemd with networkd and resolved, what kubeadm's
// preflight checks and the kubelet run (iproute2, iptables, conntrack,
// ethtool, socat, mount, util-linux, kmod), what the bootstrapper runs for
// the state disk (cryptsetup, e2fsprogs, blkid), the container runtime
// with Debian's CNI plugins, systemd-stub for the UKI, and cloud-init for
// user data on a local seed disk (NoCloud, ConfigDrive; docs/capi.md).
func packages() []string {
	return []string{
		"linux-image-amd64", "systemd", "systemd-sysv", "systemd-resolved", "udev", "initramfs-tools", "zstd",
		"cryptsetup-bin", "e2fsprogs", "util-linux", "mount", "kmod", "iproute2", "iptables", "conntrack",
		"ethtool", "socat", "ca-certificates", "containerd", "runc", "containernetworking-plugins",
		"systemd-boot-efi", "cloud-init",
	}
}

// rootFS is a cached root file system: Debian's packages installed, not yet
// configured as the node image.
type rootFS struct {
	// Dir is the tree; Digest the digest of its content (treeDigest).
	Dir    string `json:"-"`
	Digest string `json:"digest"`
	// Key is the stage's cache key.
	Key    string `json:"key"`
	Suite  string `json:"suite"`
	Mirror string `json:"mirror"`
	// SourceDateEpoch is the newest Date of the Release files the
	// packages came from, in seconds since the epoch: every timestamp of
	// the image.
	SourceDateEpoch int64 `json:"sourceDateEpoch"`
	// Packages are every installed package.
	Packages []debPackage `json:"packages"`
}

// debPackage is an installed Debian package and the digest of its .deb.
type debPackage struct {
	Name         string `json:"name"`
	Version      string `json:"version"`
	Architecture string `json:"architecture"`
	DebSHA256    string `json:"debSha256"`
}

// rootFSKey is the root file system stage's cache key: what decides its
// content (the Debian archive moves on between point releases; a cached
// tree keeps what it got).
func rootFSKey(mirror string) string {
	h := sha256.New()
	fmt.Fprintf(h, "recipe %s\nsuite %s\nmirror %s\nvariant minbase\narch amd64\n", recipeVersion, suite, mirror)
	pkgs := packages()
	sort.Strings(pkgs)
	fmt.Fprintf(h, "packages %s\n", strings.Join(pkgs, " "))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// securityMirror is the security archive beside mirror: …/debian becomes
// …/debian-security; "" when mirror does not end in /debian.
func securityMirror(mirror string) string {
	base, ok := strings.CutSuffix(strings.TrimSuffix(mirror, "/"), "/debian")
	if !ok {
		return ""
	}
	return base + "/debian-security"
}

// sourcesList is the image's apt sources: the suite, its updates and, when
// the mirror has one beside it, its security archive.
func sourcesList(mirror string) string {
	s := fmt.Sprintf("deb %[1]s %[2]s main\ndeb %[1]s %[2]s-updates main\n", mirror, suite)
	if sec := securityMirror(mirror); sec != "" {
		s += fmt.Sprintf("deb %s %s-security main\n", sec, suite)
	}
	return s
}

func checkMirror(mirror string) error {
	u, err := url.Parse(mirror)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--mirror %q is not the http(s) URL of a Debian archive, such as %s", mirror, DefaultMirror)
	}
	return nil
}

// ensureRootFS returns the cached root file system for mirror, making it
// first when the cache has none (debootstrap, then apt-get in a chroot;
// the .deb files stay in the cache's debs directory for the next time).
func ensureRootFS(ctx context.Context, p *progress, cache, mirror string) (*rootFS, error) {
	key := rootFSKey(mirror)
	dir := filepath.Join(cache, "rootfs", key)
	if r, err := loadRootFS(dir); err == nil {
		p.detail("Root file system from the cache: %s (%d packages, digest %s)", dir, len(r.Packages), short(r.Digest))
		return r, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	debs := filepath.Join(cache, "debs")
	if err := os.MkdirAll(filepath.Join(debs, "partial"), 0o755); err != nil { //nolint:gosec // public packages
		return nil, err
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("removing an interrupted root file system: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename
	tree := filepath.Join(tmp, "tree")
	if err := p.step(fmt.Sprintf("Debootstrap: Debian %s (minbase) from %s, .deb files kept in %s", suite, mirror, debs), func() error {
		_, err := run(ctx, command{unshareMount: true, env: chrootEnv()}, "debootstrap",
			"--variant=minbase", "--arch=amd64", "--components=main", "--cache-dir="+debs, suite, tree, mirror)
		return err
	}); err != nil {
		return nil, err
	}
	if err := aptInstall(ctx, p, tree, debs, mirror); err != nil {
		return nil, err
	}
	r := &rootFS{Key: key, Suite: suite, Mirror: mirror}
	var err error
	if r.Packages, err = installedPackages(ctx, tree, debs); err != nil {
		return nil, err
	}
	if r.SourceDateEpoch, err = releaseEpoch(filepath.Join(tree, "var/lib/apt/lists")); err != nil {
		return nil, err
	}
	if err := p.step("Hashing the root file system", func() (err error) {
		r.Digest, err = treeDigest(tree)
		return err
	}); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, rootFSFile), data, 0o644); err != nil { //nolint:gosec // public
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, fmt.Errorf("moving the root file system into the cache: %w", err)
	}
	r.Dir = filepath.Join(dir, "tree")
	p.detail("Root file system: %d packages, digest %s, SOURCE_DATE_EPOCH %d (%s)", len(r.Packages), short(r.Digest),
		r.SourceDateEpoch, time.Unix(r.SourceDateEpoch, 0).UTC().Format(time.RFC3339))
	return r, nil
}

// rootFSFile describes a cached root file system beside its tree.
const rootFSFile = "rootfs.json"

func loadRootFS(dir string) (*rootFS, error) {
	data, err := os.ReadFile(filepath.Join(dir, rootFSFile))
	if err != nil {
		return nil, err
	}
	var r rootFS
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("reading the cached root file system %s: %w", dir, err)
	}
	r.Dir = filepath.Join(dir, "tree")
	return &r, nil
}

// aptInstall points apt at the suite, its updates and security archive,
// upgrades what debootstrap installed and installs packages(), with
// services kept from starting in the chroot (policy-rc.d).
func aptInstall(ctx context.Context, p *progress, tree, debs, mirror string) error {
	if err := os.WriteFile(filepath.Join(tree, "etc/apt/sources.list"), []byte(sourcesList(mirror)), 0o644); err != nil { //nolint:gosec // public
		return err
	}
	policy := filepath.Join(tree, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\n# No service starts in the image build's chroot.\nexit 101\n"), 0o755); err != nil { //nolint:gosec // a program
		return err
	}
	apt := []string{"apt-get", "-y", "-q", "-o", "APT::Install-Recommends=false"}
	steps := []struct {
		what string
		argv []string
	}{
		{"Apt: updating the package lists (" + suite + ", " + suite + "-updates, " + suite + "-security)", append(apt, "update")},
		{"Apt: upgrading debootstrap's packages", append(apt, "dist-upgrade")},
		{"Apt: installing " + strings.Join(packages(), ", "), append(append(apt, "install"), packages()...)},
	}
	for _, s := range steps {
		if err := p.step(s.what, func() error {
			_, err := inChroot(ctx, tree, debs, nil, s.argv...)
			return err
		}); err != nil {
			return err
		}
	}
	return os.Remove(policy)
}

// installedPackages lists the packages installed in tree with the digest
// of each one's .deb in debs (named as apt and debootstrap name them:
// name_version_arch.deb, ':' written %3a).
func installedPackages(ctx context.Context, tree, debs string) ([]debPackage, error) {
	out, err := inChroot(ctx, tree, "", nil, "dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Architecture}\n")
	if err != nil {
		return nil, err
	}
	var list []debPackage
	lines := bufio.NewScanner(bytes.NewReader(out))
	for lines.Scan() {
		f := strings.Split(lines.Text(), "\t")
		if len(f) != 3 {
			continue
		}
		pkg := debPackage{Name: f[0], Version: f[1], Architecture: f[2]}
		deb := filepath.Join(debs, fmt.Sprintf("%s_%s_%s.deb", pkg.Name, strings.ReplaceAll(pkg.Version, ":", "%3a"), pkg.Architecture))
		if pkg.DebSHA256, err = sha256File(deb); err != nil {
			return nil, fmt.Errorf("the .deb of %s %s: %w", pkg.Name, pkg.Version, err)
		}
		list = append(list, pkg)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	return list, lines.Err()
}

// releaseEpoch returns the newest Date: of the (In)Release files in apt's
// list directory, in seconds since the epoch: when the packages were
// published, the image's SOURCE_DATE_EPOCH.
func releaseEpoch(lists string) (int64, error) {
	files, err := filepath.Glob(filepath.Join(lists, "*Release"))
	if err != nil {
		return 0, err
	}
	var newest int64
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		date, err := releaseDate(data)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", filepath.Base(f), err)
		}
		newest = max(newest, date)
	}
	if newest == 0 {
		return 0, fmt.Errorf("no Release file with a Date in %s", lists)
	}
	return newest, nil
}

// releaseDate returns the Date field of a Debian Release or InRelease
// file (Debian's repository format: "Date: Sat, 11 Jul 2026 10:16:37
// UTC", RFC 1123), in seconds since the epoch; 0 without one. The file
// comes from the mirror (apt checked its signature).
func releaseDate(data []byte) (int64, error) {
	for line := range strings.SplitSeq(string(data), "\n") {
		v, ok := strings.CutPrefix(line, "Date: ")
		if !ok {
			continue
		}
		t, err := time.Parse(time.RFC1123, strings.TrimSpace(v))
		if err != nil {
			return 0, fmt.Errorf("date %q: %w", v, err)
		}
		if t.Unix() <= 0 {
			return 0, fmt.Errorf("date %q is not after 1970", v)
		}
		return t.Unix(), nil
	}
	return 0, nil
}
