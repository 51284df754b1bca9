// Package mirror maps a cluster's downloads to a mirror its operator runs,
// for installs without internet (docs/install-airgapped.md): an HTTP(S)
// file server for the Kubernetes components of the versions table
// (internal/versions) and an OCI registry for container images.
//
// The mapping keeps the original host in the path, so one mirror serves
// every upstream without collisions and a path says where its file came
// from:
//
//	https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet
//	  → <files>/dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet
//	registry.k8s.io/kube-apiserver:v1.36.4
//	  → <registry>/registry.k8s.io/kube-apiserver:v1.36.4
//	docker.io/library/busybox:1.37 (or busybox:1.37)
//	  → <registry>/docker.io/library/busybox:1.37
//	registry.example:5000/team/app:1
//	  → <registry>/registry.example_5000/team/app:1
//
// A component keeps its pinned sha256 digest and an image its tag or
// digest: the mirror changes where bytes come from, never which bytes are
// accepted. kubeadm's imageRepository becomes <registry>/registry.k8s.io,
// which yields exactly the mapped names of the control plane's images.
package mirror

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

// kubeadmRegistry is where kubeadm pulls the control plane's images from
// by default (kubeadm's imageRepository; kubeadm v1beta4 reference).
const kubeadmRegistry = "registry.k8s.io"

// Mirror names the mirror: at least one of Files and Registry is set. A
// nil *Mirror maps every download to itself.
type Mirror struct {
	// Files is the base URL of the file server for the Kubernetes
	// components: http:// or https://, a host, an optional path prefix,
	// no query or fragment (e.g. https://mirror.example/files).
	Files string `json:"files,omitempty"`
	// Registry is the OCI registry for images: host[:port] and an
	// optional repository prefix, without a scheme (e.g.
	// mirror.example:5000 or mirror.example/k8s).
	Registry string `json:"registry,omitempty"`
	// PlainHTTP makes the nodes' containerd speak plain HTTP to Registry
	// instead of HTTPS (a registry on the cluster's own network; digests
	// are checked either way). Needs Registry.
	PlainHTTP bool `json:"plainHTTP,omitempty"`
}

// Validate checks both fields; the error names each field that is wrong
// and what it should look like.
func (m *Mirror) Validate() error {
	if m == nil {
		return nil
	}
	var errs []error
	if m.Files == "" && m.Registry == "" {
		errs = append(errs, errors.New("set files (the file server's URL) or registry (host[:port] of the OCI registry), or remove mirror"))
	}
	if m.Files != "" {
		u, err := url.Parse(m.Files)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("files %q: %w", m.Files, err))
		case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.RawQuery != "", u.Fragment != "", u.User != nil:
			errs = append(errs, fmt.Errorf("files %q is not an http:// or https:// URL with a host and no query, fragment or user, such as https://mirror.example/files", m.Files))
		}
	}
	if m.PlainHTTP && m.Registry == "" {
		errs = append(errs, errors.New("plainHTTP is set without registry: set registry (host[:port] of the OCI registry) or remove plainHTTP"))
	}
	if m.Registry != "" {
		if strings.Contains(m.Registry, "://") || strings.HasSuffix(m.Registry, "/") {
			errs = append(errs, fmt.Errorf("registry %q: give host[:port][/prefix] without a scheme or trailing slash, such as mirror.example:5000", m.Registry))
		} else if host, _, _ := strings.Cut(m.Registry, "/"); !strings.ContainsAny(host, ".:") && host != "localhost" {
			errs = append(errs, fmt.Errorf("registry %q: its first part %q is not a host (no dot or port): an image name would read it as a Docker Hub user", m.Registry, host))
		} else if _, err := name.NewRepository(m.Registry + "/mirrored"); err != nil {
			errs = append(errs, fmt.Errorf("registry %q is not host[:port][/prefix], such as mirror.example:5000: %w", m.Registry, err))
		}
	}
	return errors.Join(errs...)
}

// FileURL returns where the mirror serves the file at original, an
// http(s) URL: <files>/<original host>/<original path>. Without Files it
// returns original.
func (m *Mirror) FileURL(original string) (string, error) {
	if m == nil || m.Files == "" {
		return original, nil
	}
	u, err := url.Parse(original)
	if err != nil {
		return "", fmt.Errorf("mirroring %q: %w", original, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return "", fmt.Errorf("mirroring %q: only http(s) URLs with a host and no query have a mirror path", original)
	}
	return strings.TrimSuffix(m.Files, "/") + "/" + u.Host + u.EscapedPath(), nil
}

// Components returns list with every http(s) URL mapped by FileURL,
// hashes and install paths unchanged; file: and data: URLs (local by
// nature) stay. The input is not modified.
func (m *Mirror) Components(list []*componentsv1.Component) ([]*componentsv1.Component, error) {
	out := make([]*componentsv1.Component, len(list))
	for i, c := range list {
		mapped := &componentsv1.Component{Url: c.GetUrl(), Hash: c.GetHash(), InstallPath: c.GetInstallPath(), Extract: c.GetExtract()}
		if u, err := url.Parse(c.GetUrl()); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
			if mapped.Url, err = m.FileURL(c.GetUrl()); err != nil {
				return nil, err
			}
		}
		out[i] = mapped
	}
	return out, nil
}

// Image returns the mirror's name of image ref: <registry>/<original
// registry>/<repository> with ref's tag and digest. Docker Hub's names are
// spelled out (busybox is docker.io/library/busybox). Without Registry it
// returns ref.
func (m *Mirror) Image(ref string) (string, error) {
	if m == nil || m.Registry == "" {
		return ref, nil
	}
	parsed, err := name.ParseReference(ref, name.WithDefaultTag(""))
	if err != nil {
		return "", fmt.Errorf("mirroring image %q: %w", ref, err)
	}
	repo := m.Repository(parsed.Context())
	// ParseReference keeps one of tag and digest; a name with both keeps
	// the digest, which is what is pulled.
	switch r := parsed.(type) {
	case name.Digest:
		tag := ""
		if before, _, ok := strings.Cut(ref, "@"); ok {
			if t, err := name.NewTag(before, name.WithDefaultTag("")); err == nil && t.TagStr() != "" {
				tag = ":" + t.TagStr()
			}
		}
		return repo + tag + "@" + r.DigestStr(), nil
	case name.Tag:
		if r.TagStr() == "" {
			return repo, nil
		}
		return repo + ":" + r.TagStr(), nil
	}
	return "", fmt.Errorf("mirroring image %q: neither a tag nor a digest", ref)
}

// Repository returns the mirror's name of repository repo (without a tag):
// <registry>/<original registry>/<path>.
func (m *Mirror) Repository(repo name.Repository) string {
	if m == nil || m.Registry == "" {
		return repo.Name()
	}
	return m.Registry + "/" + registryName(repo.RegistryStr()) + "/" + repo.RepositoryStr()
}

// ImageRepository returns kubeadm's imageRepository for the mirror
// (<registry>/registry.k8s.io), or "" (kubeadm's default) without
// Registry.
func (m *Mirror) ImageRepository() string {
	if m == nil || m.Registry == "" {
		return ""
	}
	return m.Registry + "/" + kubeadmRegistry
}

// DNSImageRepository returns kubeadm's dns.imageRepository for the
// mirror (<registry>/registry.k8s.io/coredns), or "" without Registry.
// kubeadm names CoreDNS registry.k8s.io/coredns/coredns only for its
// default imageRepository and <imageRepository>/coredns for any other
// (kubeadm's images.GetDNSImage): without this, a mirrored cluster would
// pull <registry>/registry.k8s.io/coredns, which is not the mapped name.
func (m *Mirror) DNSImageRepository() string {
	if repo := m.ImageRepository(); repo != "" {
		return repo + "/coredns"
	}
	return ""
}

// registryName is a registry's part of a mirrored repository: Docker Hub
// spelled as users do (go-containerregistry names it index.docker.io), and
// a port's ':' as '_' (a repository path has no colon).
func registryName(r string) string {
	if r == name.DefaultRegistry {
		return "docker.io"
	}
	return strings.ReplaceAll(r, ":", "_")
}
