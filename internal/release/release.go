// Package release builds Gatehouse's release artifacts reproducibly and
// verifies them (docs/install.md, "Installing from a release"; make
// release):
//
//	<dir>/
//	  release.json                         what the release holds (Manifest)
//	  SHA256SUMS                           sha256 of every other file but signatures
//	  bin/linux-<arch>/<binary>            Go binaries, -trimpath, no build ID
//	  images/<image>.oci.tar               OCI image layouts (tar): a multi-arch index and its cosign signatures
//	  charts/<chart>-<version>.tgz         Helm charts running the images by digest
//	  clusterctl/*.yaml                    the CAPI provider's clusterctl repository files
//	  node-image/*                         the node image (docs/image.md)
//
// Every file but the signatures has a cosign blob signature beside it
// (<file>.sig, internal/cosignformat); every artifact but release.json,
// SHA256SUMS and the SBOMs has a CycloneDX SBOM beside it (<file>.cdx.json).
// Timestamps are fixed (Config.Epoch) and file lists sorted, so the same
// inputs give the same bytes.
package release

import (
	"fmt"
	"regexp"
	"strings"
)

// The release directory's fixed names.
const (
	manifestFile  = "release.json"
	checksumsFile = "SHA256SUMS"
	sbomSuffix    = ".cdx.json"
	binDir        = "bin"
	imagesDir     = "images"
	chartsDir     = "charts"
	clusterctlDir = "clusterctl"
	nodeImageDir  = "node-image"
	archiveSuffix = ".oci.tar"
)

// Manifest is release.json: the release's version and commit, and where
// each artifact is, relative to the release directory.
type Manifest struct {
	// Version is the release's version, vMAJOR.MINOR.PATCH.
	Version string `json:"version"`
	// Commit is the git commit the release was built from.
	Commit string `json:"commit"`
	// Binaries are the Go binaries built, by platform: every command for
	// every platform.
	Binaries []Binary `json:"binaries"`
	// Images are the container images.
	Images []Image `json:"images"`
	// Charts are the Helm charts.
	Charts []Chart `json:"charts"`
	// Clusterctl are the clusterctl repository files.
	Clusterctl []string `json:"clusterctl"`
	// NodeImage are the node image's files, if the release holds one.
	NodeImage []string `json:"nodeImage,omitempty"`
}

// Binary is one built Go binary.
type Binary struct {
	Name     string `json:"name"`
	Platform string `json:"platform"`
	Path     string `json:"path"`
}

// Image is one container image: a multi-arch OCI index in an OCI layout
// archive, signed in cosign's format for Repository.
type Image struct {
	Name       string `json:"name"`
	Repository string `json:"repository"`
	// Digest is the index's digest, sha256:<hex>.
	Digest string `json:"digest"`
	// Platforms are the index's platforms, e.g. linux/amd64.
	Platforms []string `json:"platforms"`
	Path      string   `json:"path"`
}

// Ref is repository@digest.
func (i Image) Ref() string { return i.Repository + "@" + i.Digest }

// Chart is one packaged Helm chart and the images it runs.
type Chart struct {
	Name   string   `json:"name"`
	Path   string   `json:"path"`
	Images []string `json:"images"`
}

// Image returns the image named name.
func (m Manifest) Image(name string) (Image, bool) {
	for _, i := range m.Images {
		if i.Name == name {
			return i, true
		}
	}
	return Image{}, false
}

var versionRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// checkVersion accepts a release version vMAJOR.MINOR.PATCH[-PRERELEASE]
// (SemVer 2.0.0 with a leading v, as Go modules, Helm and clusterctl use).
func checkVersion(v string) error {
	if !versionRE.MatchString(v) {
		return fmt.Errorf("release version %q: want vMAJOR.MINOR.PATCH, e.g. v0.2.0", v)
	}
	return nil
}

// chartVersion is v without its leading v (Helm's convention).
func chartVersion(v string) string { return strings.TrimPrefix(v, "v") }
