// Package basetemplate holds the CAPI provider's base templates: per
// Kubernetes version, the components (URL, sha256 digest, install path) a
// Machine's bootstrap data downloads and checks before kubeadm runs.
//
// A Source gives them. Table is the versions table compiled into the
// provider (internal/versions), its URLs mapped to a mirror when one is
// set. Dir and Bucket read one template file per version from a
// directory or an S3 bucket, CABPK-style (the kubeadm-ignition
// provider's --ignition-template-dir): a version is supported exactly
// when its file exists, and a new version is supported by adding its
// file, without rebuilding or restarting the provider (docs/capi.md,
// "Base templates"). Files are re-read when they change.
//
// The file, <root>/<version>/components.yaml with version
// "v1.MINOR.PATCH":
//
//	kubernetesVersion: v1.36.4
//	architectures:
//	  amd64:
//	  - name: kubelet
//	    url: https://mirror.example/files/dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet
//	    hash: sha256:cf2562db…
//	    installPath: /usr/local/bin/kubelet
//	  - name: cni-plugins
//	    url: …
//	    hash: sha256:…
//	    installPath: /opt/cni/bin
//	    extract: true
//
// `gatehouse mirror template` writes one from the versions table.
package basetemplate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/capi/userdatastore"
	"github.com/gatehouse-dev/gatehouse/internal/components"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// FileName is a template's file name inside its version's directory.
const FileName = "components.yaml"

// File is a base template file.
type File struct {
	// KubernetesVersion is "v1.MINOR.PATCH", the directory's name.
	KubernetesVersion string `json:"kubernetesVersion"`
	// Architectures maps amd64 and arm64 to the components in install
	// order.
	Architectures map[string][]Component `json:"architectures"`
}

// Component is one file a Machine installs.
type Component struct {
	// Name names the download on the machine (kubelet, crictl, …): a
	// letter or digit, then letters, digits, '.', '_' or '-'.
	Name string `json:"name"`
	// URL is where the machine downloads it: http or https.
	URL string `json:"url"`
	// Hash is "sha256:" and 64 lowercase hex digits.
	Hash string `json:"hash"`
	// InstallPath is the file, or with Extract the directory, installed to.
	InstallPath string `json:"installPath"`
	// Extract says the download is a gzip-compressed tar archive.
	Extract bool `json:"extract,omitempty"`
}

// Source gives the components of a Kubernetes version ("v1.36.4" or
// "1.36.4") and architecture (amd64 or arm64). An unsupported version
// gets an error wrapping render.ErrNoBaseTemplate that names the version
// and where its template would be.
type Source interface {
	Components(ctx context.Context, version, arch string) ([]versions.Component, error)
}

// Table is the versions table compiled into the provider; Mirror, when
// set, maps every URL to it (docs/install-airgapped.md).
type Table struct {
	Mirror *mirror.Mirror
}

// Components implements Source.
func (t Table) Components(_ context.Context, version, arch string) ([]versions.Component, error) {
	release, err := versions.Resolve(version)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", render.ErrNoBaseTemplate, err)
	}
	list, err := release.Components(arch)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", render.ErrNoBaseTemplate, err)
	}
	for i := range list {
		if list[i].URL, err = t.Mirror.FileURL(list[i].URL); err != nil {
			return nil, err
		}
	}
	return list, nil
}

// FromTable returns release's template for its architectures, URLs mapped
// by m (nil: the official URLs).
func FromTable(release versions.Release, m *mirror.Mirror, archs []string) (*File, error) {
	f := &File{KubernetesVersion: release.Version, Architectures: map[string][]Component{}}
	for _, arch := range archs {
		list, err := (Table{Mirror: m}).Components(context.Background(), release.Version, arch)
		if err != nil {
			return nil, err
		}
		for _, c := range list {
			f.Architectures[arch] = append(f.Architectures[arch], Component{Name: c.Name, URL: c.URL, Hash: c.Hash, InstallPath: c.InstallPath, Extract: c.Extract})
		}
	}
	return f, nil
}

// versionRE is a release version; only such directories are looked up.
var versionRE = regexp.MustCompile(`^v1\.\d+\.\d+$`)

// nameRE is a component name: safe as a file name in the install script.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Parse decodes a template file strictly and checks it is version's
// (v1.MINOR.PATCH): every component valid (package components' rules,
// http or https URLs), names unique per architecture.
func Parse(data []byte, version string) (*File, error) {
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	var f File
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if f.KubernetesVersion != version {
		return nil, fmt.Errorf("kubernetesVersion is %q, but the file is %s's", f.KubernetesVersion, version)
	}
	if len(f.Architectures) == 0 {
		return nil, errors.New("architectures is empty")
	}
	for arch, list := range f.Architectures {
		if arch != "amd64" && arch != "arm64" {
			return nil, fmt.Errorf("architecture %q is not amd64 or arm64", arch)
		}
		if len(list) == 0 {
			return nil, fmt.Errorf("architectures.%s is empty", arch)
		}
		names := map[string]bool{}
		for i, c := range list {
			if !nameRE.MatchString(c.Name) || names[c.Name] {
				return nil, fmt.Errorf("architectures.%s[%d]: name %q is empty, repeated or not letters, digits, '.', '_' and '-'", arch, i, c.Name)
			}
			names[c.Name] = true
			if !strings.HasPrefix(c.URL, "https://") && !strings.HasPrefix(c.URL, "http://") {
				return nil, fmt.Errorf("architectures.%s[%d] (%s): url %q is not http or https", arch, i, c.Name, c.URL)
			}
			if strings.ContainsAny(c.URL, "'\\ \n\t") || strings.ContainsAny(c.InstallPath, "'\\\n") {
				return nil, fmt.Errorf("architectures.%s[%d] (%s): url and installPath must not contain quotes, backslashes or white space", arch, i, c.Name)
			}
			if err := components.Validate(&componentsv1.Component{Url: c.URL, Hash: c.Hash, InstallPath: c.InstallPath, Extract: c.Extract}); err != nil {
				return nil, fmt.Errorf("architectures.%s[%d] (%s): %w", arch, i, c.Name, err)
			}
		}
	}
	return &f, nil
}

// components returns f's list for arch as the renderer takes it.
func (f *File) components(arch, where string) ([]versions.Component, error) {
	list, ok := f.Architectures[arch]
	if !ok {
		return nil, fmt.Errorf("%w: %s has no components for architecture %s", render.ErrNoBaseTemplate, where, arch)
	}
	out := make([]versions.Component, len(list))
	for i, c := range list {
		out[i] = versions.Component{Name: c.Name, URL: c.URL, Hash: c.Hash, InstallPath: c.InstallPath, Extract: c.Extract}
	}
	return out, nil
}

// normalize returns version as "v1.MINOR.PATCH", or an error wrapping
// render.ErrNoBaseTemplate.
func normalize(version string) (string, error) {
	v := version
	if !strings.HasPrefix(v, "v") {
		v = "v" + v
	}
	if !versionRE.MatchString(v) {
		return "", fmt.Errorf("%w: Kubernetes version %q is not v1.MINOR.PATCH", render.ErrNoBaseTemplate, version)
	}
	return v, nil
}

// cached is one parsed template and what it was read from.
type cached struct {
	file *File
	// stamp is the file's modification time and size (Dir) or its ETag
	// (Bucket): a different stamp means the file changed.
	stamp string
	err   error
}

// Dir reads templates from a directory: <root>/<version>/components.yaml.
// Each call stats the file and re-reads it only when its modification
// time or size changed. It is safe for concurrent use.
type Dir struct {
	root  string
	mu    sync.Mutex
	cache map[string]cached
}

// NewDir returns the Source of directory root, which must exist.
func NewDir(root string) (*Dir, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("base template directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("base template directory %s is not a directory", root)
	}
	return &Dir{root: root, cache: map[string]cached{}}, nil
}

// Components implements Source.
func (d *Dir) Components(_ context.Context, version, arch string) ([]versions.Component, error) {
	v, err := normalize(version)
	if err != nil {
		return nil, err
	}
	p := filepath.Join(d.root, v, FileName)
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: Kubernetes %s is not supported: %s does not exist (add it to support the version: docs/capi.md, \"Base templates\")", render.ErrNoBaseTemplate, v, p)
	}
	if err != nil {
		return nil, fmt.Errorf("base template of %s: %w", v, err)
	}
	stamp := fmt.Sprintf("%d/%d", fi.ModTime().UnixNano(), fi.Size())
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.cache[v]
	if !ok || c.stamp != stamp {
		c = cached{stamp: stamp}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("base template of %s: %w", v, err)
		}
		if c.file, c.err = Parse(data, v); c.err != nil {
			c.err = fmt.Errorf("%w: %s: %w", render.ErrNoBaseTemplate, p, c.err)
		}
		d.cache[v] = c
	}
	if c.err != nil {
		return nil, c.err
	}
	return c.file.components(arch, p)
}

// objectGetter reads one object of a bucket; *userdatastore.Store.
type objectGetter interface {
	Get(ctx context.Context, key, etag string) ([]byte, string, error)
	S3URI(key string) string
}

// Bucket reads templates from an S3 bucket: objects
// <prefix><version>/components.yaml. Each call asks for the object's ETag
// (one HEAD request) and downloads it only when it changed. It is safe for
// concurrent use.
type Bucket struct {
	store  objectGetter
	prefix string
	mu     sync.Mutex
	cache  map[string]cached
}

// NewBucket returns the Source of store's objects under prefix ("" or a
// path ending in "/", e.g. "templates/").
func NewBucket(store *userdatastore.Store, prefix string) (*Bucket, error) {
	if prefix != "" && (!strings.HasSuffix(prefix, "/") || strings.HasPrefix(prefix, "/")) {
		return nil, fmt.Errorf("base template prefix %q: give \"\" or a path ending in / without a leading /, such as templates/", prefix)
	}
	return &Bucket{store: store, prefix: prefix, cache: map[string]cached{}}, nil
}

// Components implements Source.
func (b *Bucket) Components(ctx context.Context, version, arch string) ([]versions.Component, error) {
	v, err := normalize(version)
	if err != nil {
		return nil, err
	}
	key := path.Join(b.prefix, v, FileName)
	b.mu.Lock()
	c := b.cache[v]
	b.mu.Unlock()
	data, etag, err := b.store.Get(ctx, key, c.stamp)
	if errors.Is(err, userdatastore.ErrObjectNotFound) {
		return nil, fmt.Errorf("%w: Kubernetes %s is not supported: %s does not exist (add it to support the version: docs/capi.md, \"Base templates\")", render.ErrNoBaseTemplate, v, b.store.S3URI(key))
	}
	if err != nil {
		return nil, fmt.Errorf("base template of %s: %w", v, err)
	}
	if data != nil {
		c = cached{stamp: etag}
		if c.file, c.err = Parse(data, v); c.err != nil {
			c.err = fmt.Errorf("%w: %s: %w", render.ErrNoBaseTemplate, b.store.S3URI(key), c.err)
		}
		b.mu.Lock()
		b.cache[v] = c
		b.mu.Unlock()
	}
	if c.err != nil {
		return nil, c.err
	}
	return c.file.components(arch, b.store.S3URI(key))
}
