// Package images builds the local cluster's container images from local
// binaries, with go-containerregistry: no registry, no pull. Each image has
// one layer holding the binaries (and symlinks to them) under
// /usr/local/bin and a PATH, since kubeadm's static pod manifests start
// components by name. The images are written as one tarball that
// `ctr images import` loads into each node's containerd.
package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// BinDir is where binaries live in the images.
const BinDir = "/usr/local/bin"

// Spec describes one image.
type Spec struct {
	// Ref is the image reference, e.g. docker.io/local/kube-apiserver:v1.36.4.
	Ref string
	// Files maps a binary's name in BinDir to the host file it is copied from.
	Files map[string]string
	// Links maps further names in BinDir to a name in Files (multi-call
	// binaries dispatch on the name they are started as).
	Links map[string]string
	// Entrypoint, if set, is the image's entrypoint (e.g. the pause binary).
	Entrypoint []string
	// Dirs are host directories copied to the same path with their files
	// (e.g. the iptables extensions a binary loads at run time).
	Dirs []string
}

// epoch is every file's and image's timestamp, so identical inputs give
// identical digests.
var epoch = time.Unix(0, 0).UTC()

// layerBuilder builds image layers in a scratch directory (never in memory: the
// Kubernetes binary alone is 156 MB) and shares a layer between images
// with the same binaries, so it is compressed and written once, and a
// node imports and unpacks it once for all the images that have it
// (kube-apiserver, kube-scheduler, kube-controller-manager and kube-proxy
// share the Kubernetes binary's). layerBuilder are gzip at its fastest level.
type layerBuilder struct {
	dir   string
	files map[string]v1.Layer
}

// newLayers returns a layer builder writing into dir.
func newLayers(dir string) *layerBuilder {
	return &layerBuilder{dir: dir, files: map[string]v1.Layer{}}
}

// layerGroup is what one files layer of an image holds: binaries and the
// files of host directories.
type layerGroup struct {
	files map[string]string
	dirs  []string
}

// layerGroups are s's files layers, in order: one per binary in Files
// (sorted by name), with the libraries it needs, then one with the files
// of Dirs and their libraries.
func layerGroups(s Spec) []layerGroup {
	var groups []layerGroup
	for _, n := range sortedKeys(s.Files) {
		groups = append(groups, layerGroup{files: map[string]string{n: s.Files[n]}})
	}
	if len(s.Dirs) > 0 {
		groups = append(groups, layerGroup{dirs: s.Dirs})
	}
	return groups
}

// Build returns the image of s for linux/amd64 or linux/arm64 (arch): a
// layer per binary (with its libraries), one with the files of its
// directories, and one with the links.
func (l *layerBuilder) Build(s Spec, arch string) (v1.Image, error) {
	var layers []v1.Layer
	for _, g := range layerGroups(s) {
		layer, err := l.filesLayer(g.files, g.dirs)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", s.Ref, err)
		}
		layers = append(layers, layer)
	}
	links, err := linksLayer(s)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, append(layers, links)...)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Created = "linux", arch, v1.Time{Time: epoch}
	cfg.Config.Env = []string{"PATH=" + BinDir + ":/usr/bin:/bin"}
	cfg.Config.Entrypoint = s.Entrypoint
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	return img, nil
}

// entry is one regular file of a files layer: its name in the image and
// the host file it is copied from.
type entry struct{ name, src string }

// filesEntries are the regular files of the layer of the binaries in
// files under BinDir, the loader and libraries of any dynamically linked
// one, and the files of the host directories dirs, in the order the
// layer holds them; and the directories the libraries need. Build writes
// exactly these, and cacheKey hashes exactly these.
func filesEntries(files map[string]string, dirs []string) (entries []entry, parentDirs []string, err error) {
	libs := map[string]bool{}
	// Host files at their own path: libraries, and the files of dirs.
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			libs[p] = true // a symlink's target is copied in its place
			// Plugins have libraries of their own (e.g. libm).
			deps, err := sharedLibraries(p)
			for _, d := range deps {
				libs[d] = true
			}
			return err
		})
		if err != nil {
			return nil, nil, err
		}
	}
	for _, n := range sortedKeys(files) {
		entries = append(entries, entry{path.Join(BinDir[1:], n), files[n]})
		deps, err := sharedLibraries(files[n])
		if err != nil {
			return nil, nil, err
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	// Dynamically linked binaries (cgo, e.g. PKCS#11) get their loader and
	// libraries at the same paths as on the host.
	parents := map[string]bool{}
	for _, lib := range sortedKeys(boolKeys(libs)) {
		for d := path.Dir(lib[1:]); d != "." && !parents[d]; d = path.Dir(d) {
			parents[d] = true
		}
	}
	for _, d := range sortedKeys(boolKeys(parents)) {
		if d != "usr" && d != "usr/local" && d != "usr/local/bin" {
			parentDirs = append(parentDirs, d)
		}
	}
	for _, lib := range sortedKeys(boolKeys(libs)) {
		entries = append(entries, entry{lib[1:], lib})
	}
	return entries, parentDirs, nil
}

// filesLayer is the tar of filesEntries, written to a file.
func (l *layerBuilder) filesLayer(files map[string]string, dirs []string) (v1.Layer, error) {
	var key strings.Builder
	for _, n := range sortedKeys(files) {
		key.WriteString(n + "=" + files[n] + "\n")
	}
	for _, d := range dirs {
		key.WriteString("dir " + d + "\n")
	}
	if layer, ok := l.files[key.String()]; ok {
		return layer, nil
	}
	entries, parentDirs, err := filesEntries(files, dirs)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(l.dir, "layer-*.tar")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, dir := range []string{"usr/", "usr/local/", "usr/local/bin/", "tmp/"} {
		mode := int64(0o755)
		if dir == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, d := range parentDirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		if err := addFile(tw, e.name, e.src); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromFile(f.Name(), tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, err
	}
	l.files[key.String()] = layer
	return layer, nil
}

// linksLayer holds s's symlinks in BinDir (small, in memory).
func linksLayer(s Spec) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range sortedKeys(s.Links) {
		target := s.Links[n]
		if _, ok := s.Files[target]; !ok {
			return nil, fmt.Errorf("link %s points to %s, which is not among the files", n, target)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: path.Join(BinDir[1:], n), Linkname: target, Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

func addFile(tw *tar.Writer, name, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: fi.Size(), ModTime: epoch}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// sharedLibraries returns the absolute paths of the loader and shared
// libraries bin needs (ldd), none for a static binary.
func sharedLibraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, out)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		for _, f := range fields {
			if strings.HasPrefix(f, "/") {
				real, err := filepath.EvalSymlinks(f)
				if err != nil {
					return nil, err
				}
				libs = append(libs, f)
				if real != f {
					libs = append(libs, real)
				}
				break
			}
		}
	}
	return libs, nil
}

func boolKeys(m map[string]bool) map[string]string {
	out := make(map[string]string, len(m))
	for k := range m {
		out[k] = k
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// WriteArchive builds every spec for arch and writes them as one
// docker-archive tarball (what `ctr images import` reads) to path.
func WriteArchive(file string, arch string, specs []Spec) error {
	scratch, err := os.MkdirTemp(filepath.Dir(file), ".layers-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	layers := newLayers(scratch)
	refs := map[name.Reference]v1.Image{}
	for _, s := range specs {
		ref, err := name.ParseReference(s.Ref)
		if err != nil {
			return fmt.Errorf("image reference %q: %w", s.Ref, err)
		}
		img, err := layers.Build(s, arch)
		if err != nil {
			return err
		}
		refs[ref] = img
	}
	return atomicfile.WriteFunc(file, 0o644, func(f *os.File) error {
		return tarball.MultiRefWrite(refs, f)
	})
}
