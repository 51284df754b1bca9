package release

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/gatehouse-dev/gatehouse/internal/atomicfile"
	"github.com/gatehouse-dev/gatehouse/internal/cosignformat"
)

// The OCI layout annotations naming an index.json entry
// (https://github.com/opencontainers/image-spec/blob/main/annotations.md;
// containerd's name for `ctr images import`).
const (
	refNameAnnotation    = "org.opencontainers.image.ref.name"
	containerdAnnotation = "io.containerd.image.name"
)

// signedDigests are the digests an image's archive carries signatures
// for: the index's and each platform manifest's (cosign sign
// --recursive), so a single-platform pull verifies too.
func signedDigests(idx v1.ImageIndex) ([]v1.Hash, error) {
	d, err := idx.Digest()
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	digests := []v1.Hash{d}
	for _, desc := range m.Manifests {
		digests = append(digests, desc.Digest)
	}
	return digests, nil
}

// writeImageArchive writes idx, tagged tag for repository, and the cosign
// signature images of its digests (tagged sha256-<hex>.sig) as an OCI
// image layout, tarred to file.
func writeImageArchive(file, scratch string, idx v1.ImageIndex, repository, tag string, signer *cosignformat.Signer, epoch time.Time) error {
	dir, err := os.MkdirTemp(scratch, "layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: tag, containerdAnnotation: repository + ":" + tag})); err != nil {
		return fmt.Errorf("writing the image's layout: %w", err)
	}
	digests, err := signedDigests(idx)
	if err != nil {
		return err
	}
	for _, d := range digests {
		sig, err := signer.SignImage(repository, d)
		if err != nil {
			return err
		}
		if err := p.AppendImage(sig, layout.WithAnnotations(map[string]string{refNameAnnotation: cosignformat.SignatureTag(d)})); err != nil {
			return fmt.Errorf("writing the signature of %s: %w", d, err)
		}
	}
	return atomicfile.WriteFunc(file, 0o644, func(f *os.File) error { return tarDir(dir, f, epoch) })
}

// errImage is returned (wrapped) when an image archive fails a check.
var errImage = errors.New("image refused")

// VerifiedImage is an image archive whose blobs, index digest and
// signatures verified: its layout (extracted) and index.
type VerifiedImage struct {
	Layout layout.Path
	Index  v1.ImageIndex
}

// verifyImageArchive extracts the OCI layout archive file into scratch and
// checks it holds the index want (release.json's digest) with every blob
// matching its digest (go-containerregistry's validate: manifests,
// configs, layers compressed and not), and a cosign signature by v naming
// repository for the index and for each platform's manifest. Errors wrap
// errImage and name file.
func verifyImageArchive(ctx context.Context, file, scratch, repository string, want v1.Hash, v *cosignformat.Verifier) (*VerifiedImage, error) {
	refuse := func(err error) (*VerifiedImage, error) {
		return nil, fmt.Errorf("%w: %s: %w", errImage, file, err)
	}
	dir, err := os.MkdirTemp(scratch, "verify-")
	if err != nil {
		return nil, err
	}
	f, err := os.Open(file)
	if err != nil {
		return refuse(err)
	}
	err = errors.Join(untar(f, dir), f.Close())
	if err != nil {
		return refuse(err)
	}
	// Every blob must hash to its name: go-containerregistry's layout
	// derives a manifest's digest from the bytes it reads, so validate
	// alone would not notice a changed manifest blob.
	if err := checkBlobs(dir); err != nil {
		return refuse(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return refuse(fmt.Errorf("not an OCI layout: %w", err))
	}
	top, err := p.ImageIndex()
	if err != nil {
		return refuse(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return refuse(err)
	}
	sigs := map[string]v1.Hash{}
	found := false
	for _, d := range m.Manifests {
		if d.Digest == want && d.MediaType.IsIndex() {
			found = true
		}
		if name := d.Annotations[refNameAnnotation]; d.MediaType.IsImage() && name != "" {
			sigs[name] = d.Digest
		}
	}
	if !found {
		return refuse(fmt.Errorf("no image index %s in the archive (release.json's digest)", want))
	}
	idx, err := top.ImageIndex(want)
	if err != nil {
		return refuse(err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validate.Index(idx); err != nil {
		return refuse(fmt.Errorf("the image's blobs do not match their digests: %w", err))
	}
	digests, err := signedDigests(idx)
	if err != nil {
		return refuse(err)
	}
	for _, d := range digests {
		sd, ok := sigs[cosignformat.SignatureTag(d)]
		if !ok {
			return refuse(fmt.Errorf("unsigned: no signature %s for %s@%s", cosignformat.SignatureTag(d), repository, d))
		}
		sig, err := top.Image(sd)
		if err != nil {
			return refuse(err)
		}
		if err := v.VerifyImage(sig, repository, d); err != nil {
			return refuse(err)
		}
	}
	return &VerifiedImage{Layout: p, Index: idx}, nil
}

// checkBlobs checks that every file under the layout's blobs/sha256 has
// the sha256 its name says, and that no other algorithm is used.
func checkBlobs(dir string) error {
	entries, err := os.ReadDir(filepath.Join(dir, "blobs"))
	if err != nil {
		return fmt.Errorf("not an OCI layout: %w", err)
	}
	for _, e := range entries {
		if e.Name() != "sha256" {
			return fmt.Errorf("blobs/%s: only sha256 blobs are expected", e.Name())
		}
	}
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		return err
	}
	for _, b := range blobs {
		got, err := fileSHA256(filepath.Join(dir, "blobs", "sha256", b.Name()))
		if err != nil {
			return err
		}
		if got != b.Name() {
			return fmt.Errorf("the image's blobs do not match their digests: blob sha256:%s has sha256 %s", b.Name(), got)
		}
	}
	return nil
}

// archivePath is where image name's archive lies in a release.
func archivePath(name string) string { return filepath.Join(imagesDir, name+archiveSuffix) }
