package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
)

// chartValues returns values.yaml with the top-level image block's
// repository and digest set (comments and everything else kept): the
// charts' templates then run repository@digest.
func chartValues(values []byte, repository, digest string) ([]byte, error) {
	lines := strings.Split(string(values), "\n")
	inImage, setRepo, setDigest := false, false, false
	for i, l := range lines {
		switch {
		case l == "image:":
			inImage = true
		case inImage && l != "" && !strings.HasPrefix(l, " ") && !strings.HasPrefix(l, "#"):
			inImage = false
		case inImage && strings.HasPrefix(l, "  repository:"):
			lines[i], setRepo = "  repository: "+repository, true
		case inImage && strings.HasPrefix(l, "  digest:"):
			lines[i], setDigest = "  digest: "+digest, true
		}
	}
	if !setRepo || !setDigest {
		return nil, fmt.Errorf("values.yaml has no top-level image.repository and image.digest to set")
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// chartMetadata returns Chart.yaml with version and appVersion set.
func chartMetadata(chartYAML []byte, version string) ([]byte, error) {
	lines := strings.Split(string(chartYAML), "\n")
	setV, setA := false, false
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "version:"):
			lines[i], setV = "version: "+chartVersion(version), true
		case strings.HasPrefix(l, "appVersion:"):
			lines[i], setA = fmt.Sprintf("appVersion: %q", version), true
		}
	}
	if !setV || !setA {
		return nil, fmt.Errorf("chart.yaml has no top-level version and appVersion to set")
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// packageChart writes the chart in src (a chart directory) as the .tgz
// `helm package` would (every file under <name>/), with Chart.yaml's
// version and values.yaml's image set, but reproducibly: Helm's
// chartutil.Save stamps each entry with the current time, so the archive
// is written here with the entries sorted (Chart.yaml first), fixed modes
// and times, and a gzip header without name or time.
func packageChart(src, name, version, repository, digest, out string, epoch time.Time) error {
	files := map[string][]byte{}
	root, err := os.OpenRoot(src)
	if err != nil {
		return fmt.Errorf("reading chart %s: %w", name, err)
	}
	defer root.Close()
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(root.FS(), p)
		files[p] = data
		return err
	})
	if err != nil {
		return fmt.Errorf("reading chart %s: %w", name, err)
	}
	if files["Chart.yaml"], err = chartMetadata(files["Chart.yaml"], version); err != nil {
		return fmt.Errorf("chart %s: %w", name, err)
	}
	if files["values.yaml"], err = chartValues(files["values.yaml"], repository, digest); err != nil {
		return fmt.Errorf("chart %s: %w", name, err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if (names[i] == "Chart.yaml") != (names[j] == "Chart.yaml") {
			return names[i] == "Chart.yaml"
		}
		return names[i] < names[j]
	})
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for _, n := range names {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: path.Join(name, n), Mode: 0o644, Size: int64(len(files[n])), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return atomicfile.Write(out, buf.Bytes(), 0o644)
}

// chartPath is where chart name's archive lies in a release.
func chartPath(name, version string) string {
	return filepath.Join(chartsDir, name+"-"+chartVersion(version)+".tgz")
}
