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
	"fmt"
	"regexp"
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
