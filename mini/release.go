package mini

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chart"

	"github.com/gatehouse-dev/gatehouse/charts"
)

// ReleaseServices are the join and key services of a release whose
// signatures and digests verified (internal/release; docs/install.md):
// the local cluster runs these images, by digest from its own registry,
// with these charts, instead of images of BinDir's binaries and the CLI's
// charts.
type ReleaseServices struct {
	// Version is the release's version: the images' tag in the registry.
	Version string
	// Images are the services' verified image indexes by service name
	// (gatehouse-joinservice, gatehouse-keyservice).
	Images map[string]v1.ImageIndex
	// Charts are the release's charts by name.
	Charts map[string]*chart.Chart
}

// push writes each image index to the cluster's registry (plain HTTP on
// the cluster bridge, which every node's containerd pulls from) as
// <registry>/<service>:<version>. The index keeps its digest, which the
// charts run it by and containerd checks on pull. A nil r pushes nothing.
func (r *ReleaseServices) push(ctx context.Context, registry string) error {
	if r == nil {
		return nil
	}
	for _, svc := range []string{"gatehouse-joinservice", "gatehouse-keyservice"} {
		idx, ok := r.Images[svc]
		if !ok {
			return fmt.Errorf("the release has no image %s", svc)
		}
		tag, err := name.NewTag(registry+"/"+svc+":"+r.Version, name.Insecure)
		if err != nil {
			return err
		}
		if err := remote.WriteIndex(tag, idx, remote.WithContext(ctx)); err != nil {
			return fmt.Errorf("pushing the release's %s to the cluster's registry: %w", svc, err)
		}
	}
	return nil
}

// chart is the chart to install for release name, and sets values to run
// the release's image by digest from the cluster's registry (push);
// without a release, the CLI's chart and values as they are.
func (r *ReleaseServices) chart(name string, values map[string]any, registry string) (*chart.Chart, error) {
	if r == nil {
		return charts.Load(name)
	}
	c, ok := r.Charts[name]
	idx, hasImage := r.Images[name]
	if !ok || !hasImage {
		return nil, fmt.Errorf("the release has no chart and image %s", name)
	}
	digest, err := idx.Digest()
	if err != nil {
		return nil, err
	}
	image, _ := values["image"].(map[string]any)
	if image == nil {
		image = map[string]any{}
	}
	image["repository"], image["digest"], image["pullPolicy"] = registry+"/"+name, digest.String(), "IfNotPresent"
	values["image"] = image
	return c, nil
}
