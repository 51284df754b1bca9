package mini

import (
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"helm.sh/helm/v3/pkg/chart"

	"github.com/gatehouse-dev/gatehouse/charts"
	"github.com/gatehouse-dev/gatehouse/mini/images"
)

// ReleaseServices are the join and key services of a release whose
// signatures and digests verified (internal/release; docs/install.md):
// the local cluster loads these images into its nodes and installs these
// charts, instead of images of BinDir's binaries and the CLI's charts.
type ReleaseServices struct {
	// Version is the release's version, the images' tag in the nodes.
	Version string
	// Images are the services' linux/amd64 images by service name
	// (gatehouse-joinservice, gatehouse-keyservice).
	Images map[string]ReleaseImage
	// Charts are the release's charts by name.
	Charts map[string]*chart.Chart
}

// ReleaseImage is one verified image: its repository and its linux/amd64
// manifest's image.
type ReleaseImage struct {
	Repository string
	Image      v1.Image
}

// imageSpec is the node image of service svc: the release's image, tagged
// with the release's version. The nodes import a docker archive, which
// keeps the image's config and layers (the image ID is the verified
// config's digest) but not its manifest digest, so the charts run it by
// that tag (chart).
func (r *ReleaseServices) imageSpec(svc string) (images.Spec, error) {
	img, ok := r.Images[svc]
	if !ok {
		return images.Spec{}, fmt.Errorf("the release has no image %s", svc)
	}
	return images.Spec{Ref: img.Repository + ":" + r.Version, Image: img.Image}, nil
}

// chart is the chart to install for release name, and sets values to run
// the release's image by tag (imageSpec); without a release, the CLI's.
func (r *ReleaseServices) chart(name string, values map[string]any) (*chart.Chart, error) {
	if r == nil {
		return charts.Load(name)
	}
	c, ok := r.Charts[name]
	img, hasImage := r.Images[name]
	if !ok || !hasImage {
		return nil, fmt.Errorf("the release has no chart and image %s", name)
	}
	image, _ := values["image"].(map[string]any)
	if image == nil {
		image = map[string]any{}
	}
	image["repository"], image["tag"], image["digest"] = img.Repository, r.Version, ""
	values["image"] = image
	return c, nil
}
