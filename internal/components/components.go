// Package components is the format of the components a node installs
// (api/components/v1: a URL, its pinned "sha256:" digest, an install path),
// shared by everyone who hands components out (the CLI, the join service,
// the versions table) and the installer that fetches them.
package components

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

// Validate checks a component: a URL with scheme https, http, file or data
// (the digest makes the transport's integrity irrelevant), a hash of the
// form "sha256:" and 64 lowercase hex digits, and an absolute, clean
// install path.
func Validate(c *componentsv1.Component) error {
	u, err := url.Parse(c.GetUrl())
	if err != nil {
		return fmt.Errorf("component URL %q: %w", c.GetUrl(), err)
	}
	switch u.Scheme {
	case "https", "http", "file", "data":
	default:
		return fmt.Errorf("component URL %q: scheme %q is not https, http, file or data", c.GetUrl(), u.Scheme)
	}
	if _, err := ParseHash(c.GetHash()); err != nil {
		return fmt.Errorf("component %s: %w", c.GetUrl(), err)
	}
	p := c.GetInstallPath()
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return fmt.Errorf("component %s: install path %q must be an absolute, clean path other than /", c.GetUrl(), p)
	}
	return nil
}

// ParseHash returns the digest of a component hash, "sha256:" and 64
// lowercase hex digits (32 bytes), or an error naming the malformed hash.
func ParseHash(h string) ([]byte, error) {
	hexDigest, ok := strings.CutPrefix(h, "sha256:")
	if !ok || len(hexDigest) != 2*sha256.Size || strings.ToLower(hexDigest) != hexDigest {
		return nil, fmt.Errorf("hash %q is not \"sha256:\" followed by 64 lowercase hex digits", h)
	}
	return hex.DecodeString(hexDigest)
}
