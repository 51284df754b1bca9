package images

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// A spec with a built image (a verified release's) goes into the archive
// with its config and layers as they are, for its architecture only.
func TestPrebuiltImage(t *testing.T) {
	img, err := random.Image(256, 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const ref = "ghcr.io/gatehouse-dev/gatehouse-joinservice:v0.1.0"
	specs := []Spec{{Ref: ref, Image: img}}
	archive := filepath.Join(t.TempDir(), "images.tar")
	if err := WriteArchive(archive, "amd64", specs); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	wantID, _ := img.ConfigName()
	gotID, err := got.ConfigName()
	if err != nil || gotID != wantID {
		t.Errorf("the archive's image ID is %s (%v), want the built image's %s", gotID, err, wantID)
	}
	if err := WriteArchive(filepath.Join(t.TempDir(), "arm64.tar"), "arm64", specs); err == nil || !strings.Contains(err.Error(), "is for amd64, not arm64") {
		t.Errorf("an amd64 image in an arm64 archive: %v", err)
	}
	other, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	k1, err := cacheKey("amd64", specs)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := cacheKey("amd64", []Spec{{Ref: ref, Image: other}})
	if err != nil {
		t.Fatal(err)
	}
	if k1 == k2 {
		t.Error("two different built images give the same cache key")
	}
}
