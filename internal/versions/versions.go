// Package versions is the table of Kubernetes versions Gatehouse supports:
// the newest patch release of each minor version in
// kubernetes-components.yaml (official sha256 digests, see its header),
// each with the ordered components a node installs for linux/amd64 and
// linux/arm64. The Kubernetes version chosen at init decides every binary a
// node downloads.
//
// To update: replace kubernetes-components.yaml and run
// `go generate ./internal/versions` (or `make generate`).
package versions

//go:generate go run ../../hack/versionsgen -in kubernetes-components.yaml -out zz_generated.go

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

// Component is one file a node installs.
type Component struct {
	// Name is kubelet, kubeadm, kubectl, crictl or cni-plugins.
	Name string
	// URL is the official download URL.
	URL string
	// Hash is "sha256:" and 64 lowercase hex digits.
	Hash string
	// InstallPath is the file, or with Extract the directory, installed to.
	InstallPath string
	// Extract says the download is a gzip-compressed tar archive.
	Extract bool
}

// Release is a supported Kubernetes release.
type Release struct {
	// Version is "v1.MINOR.PATCH".
	Version string
	// Crictl and CNIPlugins are the versions of those components.
	Crictl, CNIPlugins string
	components         map[string][]Component
}

// architectures are the CPU architectures components exist for.
var architectures = []string{"amd64", "arm64"}

// Components returns the release's components for arch (amd64 or arm64),
// in install order: kubelet, kubeadm, kubectl, crictl, CNI plugins.
func (r Release) Components(arch string) ([]Component, error) {
	list, ok := r.components[arch]
	if !ok {
		return nil, fmt.Errorf("no Kubernetes components for architecture %q: supported are %s", arch, strings.Join(architectures, ", "))
	}
	return append([]Component(nil), list...), nil
}

// Proto returns the components for arch as join and init tickets carry them.
func (r Release) Proto(arch string) ([]*componentsv1.Component, error) {
	list, err := r.Components(arch)
	if err != nil {
		return nil, err
	}
	out := make([]*componentsv1.Component, len(list))
	for i, c := range list {
		out[i] = &componentsv1.Component{Url: c.URL, Hash: c.Hash, InstallPath: c.InstallPath, Extract: c.Extract}
	}
	return out, nil
}

// Supported returns the supported versions, newest first.
func Supported() []string {
	out := make([]string, len(releases))
	for i, r := range releases {
		out[i] = r.Version
	}
	return out
}

// Default returns the default release, the newest.
func Default() Release { return releases[0] }

var versionRE = regexp.MustCompile(`^v?1\.(\d+)(?:\.(\d+))?$`)

// Resolve returns the release for v: "1.35" or "v1.35" (the minor's
// supported patch release) or "v1.35.8" / "1.35.8" (exactly that one).
// Malformed or unsupported versions get an error listing the supported
// ones.
func Resolve(v string) (Release, error) {
	m := versionRE.FindStringSubmatch(strings.TrimSpace(v))
	if m == nil {
		return Release{}, fmt.Errorf("kubernetes version %q is malformed: use 1.MINOR or v1.MINOR.PATCH; supported: %s", v, strings.Join(Supported(), ", "))
	}
	for _, r := range releases {
		minor := strings.Split(r.Version, ".")[1]
		if minor != m[1] {
			continue
		}
		if m[2] == "" || r.Version == "v1."+m[1]+"."+m[2] {
			return r, nil
		}
	}
	return Release{}, fmt.Errorf("kubernetes version %q is not supported: supported are %s (a minor version such as 1.%s picks its patch release)", v, strings.Join(Supported(), ", "), strings.Split(releases[0].Version, ".")[1])
}

// parse returns a "v1.MINOR.PATCH" version's minor and patch numbers.
func parse(v string) (minor, patch int, err error) {
	m := versionRE.FindStringSubmatch(strings.TrimSpace(v))
	if m == nil || m[2] == "" {
		return 0, 0, fmt.Errorf("kubernetes version %q is not a release version like v1.36.4", v)
	}
	minor, _ = strconv.Atoi(m[1])
	patch, _ = strconv.Atoi(m[2])
	return minor, patch, nil
}

// Newer reports whether release version a ("v1.MINOR.PATCH") is newer
// than b.
func Newer(a, b string) (bool, error) {
	am, ap, err := parse(a)
	if err != nil {
		return false, err
	}
	bm, bp, err := parse(b)
	if err != nil {
		return false, err
	}
	return am > bm || (am == bm && ap > bp), nil
}

// CheckUpgrade says whether a cluster at from ("v1.MINOR.PATCH", which
// need not be in the table) may move to the supported release to, by
// Kubernetes' version skew policy as kubeadm applies it
// (https://kubernetes.io/releases/version-skew-policy/, "Supported
// component upgrade order"; kubeadm's upgrade guide): a newer patch
// release of the same minor version, or the next minor version. The
// errors name what is refused (a downgrade, a skipped minor version) and
// the version to go to instead. The same version is no error: a roll
// that stopped part-way is resumed with it.
func CheckUpgrade(from string, to Release) error {
	fromMinor, fromPatch, err := parse(from)
	if err != nil {
		return fmt.Errorf("the cluster's version: %w", err)
	}
	toMinor, toPatch, err := parse(to.Version)
	if err != nil {
		return err
	}
	switch {
	case fromMinor > toMinor || (fromMinor == toMinor && fromPatch > toPatch):
		return fmt.Errorf("%s is older than the cluster's %s: Kubernetes cannot be downgraded (etcd's data and the API's stored versions move forward only); restore a backup to go back", to.Version, from)
	case toMinor > fromMinor+1:
		next := fmt.Sprintf("1.%d", fromMinor+1)
		if r, err := Resolve(next); err == nil {
			next = r.Version
		}
		return fmt.Errorf("%s skips a minor version: the cluster runs %s and Kubernetes upgrades one minor version at a time; upgrade to %s first", to.Version, from, next)
	}
	return nil
}

// LocalBuild returns the release's kubelet, kubeadm and kubectl for arch
// as a local build provides them: each a file:// URL of the multi-call
// binary "kube" in dir (hack/kube-binaries.sh builds it: kubelet, kubeadm
// and kubectl in one file), with that file's real sha256, installed to
// the versions table's paths. crictl and the CNI plugins have no local
// build and are left out. For clusters without the official downloads:
// the local cluster, and air-gapped upgrades (docs/upgrades.md).
func (r Release) LocalBuild(arch, dir string) ([]*componentsv1.Component, error) {
	list, err := r.Components(arch)
	if err != nil {
		return nil, err
	}
	kube := filepath.Join(dir, "kube")
	f, err := os.Open(kube)
	if err != nil {
		return nil, fmt.Errorf("the local Kubernetes build: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("hashing %s: %w", kube, err)
	}
	hash := "sha256:" + hex.EncodeToString(h.Sum(nil))
	var out []*componentsv1.Component
	for _, c := range list {
		switch c.Name {
		case "kubelet", "kubeadm", "kubectl":
			out = append(out, &componentsv1.Component{Url: "file://" + kube, Hash: hash, InstallPath: c.InstallPath})
		}
	}
	return out, nil
}
