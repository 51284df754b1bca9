// Package buildinfo reports what a Gatehouse binary was built from, read from
// the Go build information embedded by the toolchain (runtime/debug).
package buildinfo

import (
	"runtime"
	"runtime/debug"
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
}

// Read returns the running binary's Info.
func Read() Info {
	info := Info{Version: "(devel)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
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
