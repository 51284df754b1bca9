package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// imageBinDir is where an image holds its binary; the image's PATH has it.
const imageBinDir = "/usr/local/bin"

// imageFile is one regular file of an image: its path in the image
// (relative, no leading slash), the host file it comes from and, for a
// library, the Debian package that installed it.
type imageFile struct {
	name, src string
	deb       debPackage
}

// imageFiles are the files of the image of the binary bin for linux/arch
// (named name in imageBinDir): the binary and, for a dynamically linked
// one (cgo), its loader and libraries from the architecture's C
// toolchain (cToolchain.runtimeFiles).
func (b *builder) imageFiles(ctx context.Context, name, arch, bin string) ([]imageFile, error) {
	files := []imageFile{{name: path.Join(imageBinDir[1:], name), src: bin}}
	interp, _, err := elfDynamic(bin)
	if err != nil {
		return nil, err
	}
	if interp != "" {
		tc, ok := b.toolchains[arch]
		if !ok {
			return nil, fmt.Errorf("%s is linked dynamically (loader %s) but was not built with cgo", bin, interp)
		}
		libs, err := tc.runtimeFiles(ctx, bin)
		if err != nil {
			return nil, err
		}
		files = append(files, libs...)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	return files, nil
}

// buildImage returns the linux/arch image of files: one gzip layer (fixed
// modes and times), the binary as entrypoint, OCI media types and a
// creation time of epoch.
func buildImage(scratch, binary, arch string, files []imageFile, epoch time.Time) (v1.Image, error) {
	// Compressed once, into a file: a layer from an uncompressed tar would
	// be compressed again each time its digest or bytes are read.
	f, err := os.CreateTemp(scratch, "layer-*.tar.gz")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zw, err := gzip.NewWriterLevel(f, gzip.DefaultCompression) // no name, no time: the same bytes every time
	if err != nil {
		return nil, err
	}
	if err := writeLayer(zw, files, epoch); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromFile(f.Name(), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Created = "linux", arch, v1.Time{Time: epoch}
	cfg.Config.Env = []string{"PATH=" + imageBinDir + ":/usr/bin:/bin"}
	cfg.Config.Entrypoint = []string{path.Join(imageBinDir, binary)}
	return mutate.ConfigFile(img, cfg)
}

// writeLayer writes the tar of files and their parent directories.
func writeLayer(w io.Writer, files []imageFile, epoch time.Time) error {
	tw := tar.NewWriter(w)
	dirs := map[string]bool{"tmp": true}
	for _, f := range files {
		for d := path.Dir(f.name); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		sorted = append(sorted, d)
	}
	sort.Strings(sorted)
	for _, d := range sorted {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := addTarFile(tw, f.name, f.src, 0o755, epoch); err != nil {
			return err
		}
	}
	return tw.Close()
}

// addTarFile adds the host file src (symlinks followed) as name.
func addTarFile(tw *tar.Writer, name, src string, mode int64, epoch time.Time) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: fi.Size(), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// imageIndex is the OCI index of the images by platform (linux/<arch>).
func imageIndex(imgs map[string]v1.Image) (v1.ImageIndex, error) {
	arches := make([]string, 0, len(imgs))
	for a := range imgs {
		arches = append(arches, a)
	}
	sort.Strings(arches)
	var adds []mutate.IndexAddendum
	for _, a := range arches {
		adds = append(adds, mutate.IndexAddendum{Add: imgs[a], Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: a}}})
	}
	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...), nil
}

// tarDir writes the regular files under dir (sorted, fixed modes and
// times) as a tar to out: the OCI layout's archive form.
func tarDir(dir string, out io.Writer, epoch time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		names = append(names, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	tw := tar.NewWriter(out)
	for _, n := range names {
		if err := addTarFile(tw, n, filepath.Join(dir, n), 0o644, epoch); err != nil {
			return err
		}
	}
	return tw.Close()
}

// untar extracts the regular files of the tar r into dir, refusing
// anything but regular files and directories, and names leaving dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the archive: %w", err)
		}
		name := path.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("the archive holds %q, outside its directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(filepath.Join(dir, name), 0o750); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Join(dir, path.Dir(name)), 0o750); err != nil {
				return err
			}
			if err := writeFrom(filepath.Join(dir, name), tr); err != nil {
				return err
			}
		default:
			return fmt.Errorf("the archive holds %q of type %q: only files and directories belong in an OCI layout", h.Name, h.Typeflag)
		}
	}
}

func writeFrom(name string, r io.Reader) error {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	return errors.Join(err, f.Close())
}

// readAllLimited reads at most limit bytes of r.
func readAllLimited(r io.Reader, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return buf.Bytes(), nil
}
