package images

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// format names what WriteArchive writes, beyond its inputs: change it
// whenever the builder writes something else for the same inputs (layer
// layout, compression, configuration), so cached archives are rebuilt.
const format = "gatehouse-mini-images/1"

// cacheKey is the cache key of the archive WriteArchive writes for arch and
// specs: a digest of the builder's format and go-containerregistry
// version, arch, and every spec's reference, entrypoint, links, and the
// name and content digest of every file its layers hold (binaries, their
// shared libraries, the files of its directories). Any change to what
// goes into the archive changes the key.
func cacheKey(arch string, specs []Spec) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nggcr %s\narch %s\n", format, ggcrVersion(), arch)
	type layerFiles struct {
		entries []entry
		dirs    []string
	}
	layers := make([][]layerFiles, len(specs)) // each spec's files layers
	for i, s := range specs {
		for _, g := range layerGroups(s) {
			entries, dirs, err := filesEntries(g.files, g.dirs)
			if err != nil {
				return "", fmt.Errorf("image %s: %w", s.Ref, err)
			}
			layers[i] = append(layers[i], layerFiles{entries, dirs})
		}
	}
	// Hash each distinct host file once, two at a time (the Kubernetes
	// binary alone is 156 MB).
	digests := map[string]string{}
	for _, spec := range layers {
		for _, l := range spec {
			for _, e := range l.entries {
				digests[e.src] = ""
			}
		}
	}
	if err := fileDigests(digests); err != nil {
		return "", err
	}
	for i, s := range specs {
		fmt.Fprintf(h, "image %q entrypoint %q\n", s.Ref, s.Entrypoint)
		for _, n := range sortedKeys(s.Links) {
			fmt.Fprintf(h, "link %q -> %q\n", n, s.Links[n])
		}
		for j, l := range layers[i] {
			fmt.Fprintf(h, "layer %d\n", j)
			for _, d := range l.dirs {
				fmt.Fprintf(h, "dir %q\n", d)
			}
			for _, e := range l.entries {
				fmt.Fprintf(h, "file %q sha256:%s\n", e.name, digests[e.src])
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fileDigests fills in the sha256 of each file named by digests' keys.
func fileDigests(digests map[string]string) error {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	work := make(chan string)
	for range 2 {
		wg.Go(func() {
			for path := range work {
				d, err := FileDigest(path)
				mu.Lock()
				digests[path] = d
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	for _, p := range sortedKeys(digests) {
		work <- p
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// FileDigest is the hex sha256 of the file at path.
func FileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func ggcrVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "github.com/google/go-containerregistry" {
				return m.Version
			}
		}
	}
	return "unknown"
}

// Cache keeps image archives in a directory, named by their cacheKey: a second
// `mini up` with the same binaries skips the build. Archives are written
// to a temporary file and renamed into place, so an interrupted build
// leaves no partial archive under a key's name; the Keep most recently
// used archives stay, with what is kept beside them (<key>.*; names
// starting with a dot are temporary).
type Cache struct {
	Dir string
	// Keep is how many archives stay (0 is 3).
	Keep int
}

// staleAfter is the age after which a temporary file or scratch directory
// in the cache is a leftover of a build that was killed, not one in
// progress.
const staleAfter = time.Hour

// Cached is an archive in the cache.
type Cached struct {
	// Path is the archive; Digest its hex sha256.
	Path, Digest string
	// Hit says whether it was cached before (else it was just built).
	Hit bool
}

// Archive returns the cached archive of specs for arch, building and
// caching it first when the cache lacks it. The archive's digest is kept
// beside it (<key>.tar.sha256), so a hit does not read the archive.
func (c Cache) Archive(arch string, specs []Spec) (Cached, error) {
	key, err := cacheKey(arch, specs)
	if err != nil {
		return Cached{}, err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil { //nolint:gosec // the images hold no secrets
		return Cached{}, err
	}
	path := filepath.Join(c.Dir, key+".tar")
	now := time.Now()
	hit := true
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		hit = false
		if err := WriteArchive(path, arch, specs); err != nil {
			return Cached{}, err
		}
		c.prune(path)
	} else if err != nil {
		return Cached{}, err
	} else {
		// Most recently used first when the cache is pruned.
		_ = os.Chtimes(path, now, now)
	}
	digest, err := c.digest(path)
	if err != nil {
		return Cached{}, err
	}
	return Cached{Path: path, Digest: digest, Hit: hit}, nil
}

// digest returns the digest of the archive at path: the one kept beside
// it, or else its sha256, which is then kept.
func (c Cache) digest(path string) (string, error) {
	file := path + ".sha256"
	if data, err := os.ReadFile(file); err == nil {
		if d := strings.TrimSpace(string(data)); len(d) == sha256.Size*2 {
			if _, err := hex.DecodeString(d); err == nil {
				return d, nil
			}
		}
	}
	d, err := FileDigest(path)
	if err != nil {
		return "", err
	}
	return d, atomicfile.Write(file, []byte(d+"\n"), 0o644)
}

// prune removes all but the Keep most recently used archives (never
// keep, the one just written) and the leftovers of killed builds.
func (c Cache) prune(keep string) {
	n := c.Keep
	if n <= 0 {
		n = 3
	}
	list, err := os.ReadDir(c.Dir)
	if err != nil {
		return
	}
	type archive struct {
		path string
		used time.Time
	}
	var archives []archive
	for _, e := range list {
		p := filepath.Join(c.Dir, e.Name())
		info, err := e.Info()
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(e.Name(), "."):
			// A temporary archive or layer scratch directory.
			if time.Since(info.ModTime()) > staleAfter {
				_ = os.RemoveAll(p)
			}
		case strings.HasSuffix(e.Name(), ".tar") && p != keep:
			archives = append(archives, archive{p, info.ModTime()})
		}
	}
	slices.SortFunc(archives, func(a, b archive) int { return b.used.Compare(a.used) })
	for i, a := range archives {
		if i+1 >= n { // keep counts among the n
			// The archive and what is kept beside it (<key>.*).
			key := strings.TrimSuffix(filepath.Base(a.path), ".tar")
			for _, e := range list {
				if strings.HasPrefix(e.Name(), key+".") {
					_ = os.RemoveAll(filepath.Join(c.Dir, e.Name()))
				}
			}
		}
	}
}
