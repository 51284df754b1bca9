package release

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
)

// errRefused is returned (wrapped) when a release fails verification; the
// message names the artifact (its path in the release).
var errRefused = errors.New("release refused")

// maxMetadataSize bounds SHA256SUMS and release.json.
const maxMetadataSize = 4 << 20

// Verified is a release whose every file verified.
type Verified struct {
	// Dir is the release directory.
	Dir string
	// Manifest is its release.json.
	Manifest Manifest
	// Images are its images, verified and extracted, by name.
	Images map[string]*VerifiedImage
	// sums are SHA256SUMS's verified checksums.
	sums map[string]string
}

// LoadChart returns the release's chart name (the Helm SDK's loader over
// the archive's bytes), after checking those bytes against the verified
// SHA256SUMS again: what is loaded is what was verified, even if the file
// changed since Verify. It also returns the image the chart runs.
func (r *Verified) LoadChart(name string) (*chart.Chart, Image, error) {
	for _, c := range r.Manifest.Charts {
		if c.Name != name {
			continue
		}
		data, err := os.ReadFile(filepath.Join(r.Dir, filepath.FromSlash(c.Path)))
		if err != nil {
			return nil, Image{}, err
		}
		if got := sha256Hex(data); got != r.sums[c.Path] {
			return nil, Image{}, fmt.Errorf("%w: %s: changed since it was verified (sha256 %s)", errRefused, c.Path, got)
		}
		ch, err := loader.LoadArchive(bytes.NewReader(data))
		if err != nil {
			return nil, Image{}, fmt.Errorf("%s: %w", c.Path, err)
		}
		for _, img := range r.Manifest.Images {
			if slices.Contains(c.Images, img.Ref()) {
				return ch, img, nil
			}
		}
		return nil, Image{}, fmt.Errorf("%w: %s: runs no image of the release", errRefused, c.Path)
	}
	return nil, Image{}, fmt.Errorf("the release has no chart %s", name)
}

// Verify checks the release in dir with the public key v, in this order:
// SHA256SUMS's signature; that SHA256SUMS lists every file but the
// signatures; each listed file's sha256 and its blob signature; release.json;
// each image archive's blobs, index digest (release.json's) and image
// signatures (verifyImageArchive, extracted into scratch); and that each
// chart runs its image by that digest. Every refusal wraps errRefused and
// names the artifact.
func Verify(ctx context.Context, dir string, v *cosignformat.Verifier, scratch string) (*Verified, error) {
	refuse := func(artifact string, err error) (*Verified, error) {
		return nil, fmt.Errorf("%w: %s: %w", errRefused, artifact, err)
	}
	sumsData, err := readSmall(filepath.Join(dir, checksumsFile))
	if err != nil {
		return refuse(checksumsFile, err)
	}
	if err := verifyBlob(v, dir, checksumsFile); err != nil {
		return refuse(checksumsFile, err)
	}
	sums, err := parseChecksums(sumsData)
	if err != nil {
		return refuse(checksumsFile, err)
	}
	files, err := listFiles(dir)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if _, ok := sums[f]; !ok {
			return refuse(f, fmt.Errorf("not listed in %s: a file the release was not built with", checksumsFile))
		}
	}
	names := make([]string, 0, len(sums))
	for n := range sums {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, f := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		got, err := fileSHA256(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			return refuse(f, fmt.Errorf("listed in %s but unreadable: %w", checksumsFile, err))
		}
		if got != sums[f] {
			return refuse(f, fmt.Errorf("sha256 %s, %s says %s: the file was changed", got, checksumsFile, sums[f]))
		}
		if err := verifyBlob(v, dir, f); err != nil {
			return refuse(f, err)
		}
	}
	data, err := readSmall(filepath.Join(dir, manifestFile))
	if err != nil {
		return refuse(manifestFile, err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return refuse(manifestFile, err)
	}
	out := &Verified{Dir: dir, Manifest: m, Images: map[string]*VerifiedImage{}, sums: sums}
	for _, img := range m.Images {
		want, err := v1.NewHash(img.Digest)
		if err != nil {
			return refuse(manifestFile, fmt.Errorf("image %s: %w", img.Name, err))
		}
		if _, ok := sums[img.Path]; !ok {
			return refuse(img.Path, fmt.Errorf("image %s's archive is not listed in %s", img.Name, checksumsFile))
		}
		vi, err := verifyImageArchive(ctx, filepath.Join(dir, filepath.FromSlash(img.Path)), scratch, img.Repository, want, v)
		if err != nil {
			return refuse(img.Path, err)
		}
		out.Images[img.Name] = vi
	}
	for _, c := range m.Charts {
		if err := verifyChartImages(dir, c, m); err != nil {
			return refuse(c.Path, err)
		}
	}
	return out, nil
}

// verifyBlob checks rel's cosign blob signature rel.sig.
func verifyBlob(v *cosignformat.Verifier, dir, rel string) error {
	file := filepath.Join(dir, filepath.FromSlash(rel))
	sig, err := readSmall(file + cosignformat.SignatureSuffix)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unsigned: no %s%s", rel, cosignformat.SignatureSuffix)
	}
	if err != nil {
		return err
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return v.VerifyBlob(f, sig)
}

// verifyChartImages checks the chart runs its images by the digests
// release.json gives them: values image.repository and image.digest.
func verifyChartImages(dir string, c Chart, m Manifest) error {
	ch, err := loader.Load(filepath.Join(dir, filepath.FromSlash(c.Path)))
	if err != nil {
		return fmt.Errorf("not a Helm chart: %w", err)
	}
	image, _ := ch.Values["image"].(map[string]any)
	repo, _ := image["repository"].(string)
	digest, _ := image["digest"].(string)
	ref := repo + "@" + digest
	for _, img := range m.Images {
		if img.Ref() == ref && slices.Contains(c.Images, ref) {
			return nil
		}
	}
	return fmt.Errorf("runs image %q, not one of the release's images by digest", ref)
}

func readSmall(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAllLimited(f, maxMetadataSize)
}
