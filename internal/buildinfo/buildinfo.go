// Package buildinfo reports what a Gatehouse binary was built from: the
// version, commit and image digests a release build sets through the
// linker (make release: -X for version, commit and images), else the Go
// build information embedded by the toolchain (runtime/debug).
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
)

// Set by the linker in a release build (internal/release: -ldflags -X);
// empty otherwise. They are never written at run time.
var (
	// version is the release's version, e.g. v0.2.0.
	version string
	// commit is the git commit the release was built from.
	commit string
	// images are the release's images: comma-separated
	// name=repository@sha256:<hex>.
	images string
)

// Info describes a binary.
type Info struct {
	// Version is the main module's version: a release tag such as "v0.1.0",
	// a pseudo-version, or "(devel)" for a build from a working tree.
	Version string `json:"version"`
	// Revision is the VCS commit the binary was built from, when recorded.
	Revision string `json:"revision,omitempty"`
	// Modified reports uncommitted changes at build time, when recorded.
	Modified bool `json:"modified,omitempty"`
	// GoVersion is the Go toolchain, e.g. "go1.26.8".
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
	// Images are the container images the binary was released with, by
	// digest (repository@sha256:<hex>), sorted by name; none for a
	// development build.
	Images []Image `json:"images"`
}

// Image is a released container image.
type Image struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
}

// Read returns the running binary's Info.
func Read() Info {
	info := Info{Version: "(devel)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH, Images: []Image{}}
	for _, kv := range strings.Split(images, ",") {
		if name, ref, ok := strings.Cut(kv, "="); ok {
			info.Images = append(info.Images, Image{Name: name, Ref: ref})
		}
	}
	sort.Slice(info.Images, func(i, j int) bool { return info.Images[i].Name < info.Images[j].Name })
	if version != "" {
		info.Version, info.Revision = version, commit
		return info
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	if bi.Main.Version != "" {
		info.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}
