package mini

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
	"helm.sh/helm/v3/pkg/chart"

	"github.com/gatehouse-dev/gatehouse/charts"
)

// With a release, mini installs the release's chart running the release's
// image by the tag its nodes import it under; without, the CLI's chart.
func TestReleaseServicesChart(t *testing.T) {
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	relChart := &chart.Chart{Metadata: &chart.Metadata{Name: "gatehouse-joinservice", Version: "0.2.0"}}
	r := &ReleaseServices{Version: "v0.2.0",
		Images: map[string]ReleaseImage{"gatehouse-joinservice": {Repository: "ghcr.io/gatehouse-dev/gatehouse-joinservice", Image: img}},
		Charts: map[string]*chart.Chart{"gatehouse-joinservice": relChart}}
	values := map[string]any{"image": map[string]any{"pullPolicy": "Never"}}
	c, err := r.chart("gatehouse-joinservice", values)
	if err != nil {
		t.Fatal(err)
	}
	if c != relChart {
		t.Errorf("chart %v, want the release's", c.Metadata)
	}
	want := map[string]any{"pullPolicy": "Never", "repository": "ghcr.io/gatehouse-dev/gatehouse-joinservice", "tag": "v0.2.0", "digest": ""}
	got := values["image"].(map[string]any)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("image.%s = %v, want %v", k, got[k], v)
		}
	}
	spec, err := r.imageSpec("gatehouse-joinservice")
	if err != nil || spec.Ref != "ghcr.io/gatehouse-dev/gatehouse-joinservice:v0.2.0" || spec.Image != img {
		t.Errorf("imageSpec = %+v, %v", spec, err)
	}
	if _, err := r.chart("gatehouse-keyservice", map[string]any{}); err == nil {
		t.Error("a release without the key service's chart gave one")
	}
	var none *ReleaseServices
	c, err = none.chart("gatehouse-keyservice", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	builtin, err := charts.Load("gatehouse-keyservice")
	if err != nil {
		t.Fatal(err)
	}
	if c.Metadata.Version != builtin.Metadata.Version || c.Metadata.Name != "gatehouse-keyservice" {
		t.Errorf("without a release: chart %v, want the CLI's", c.Metadata)
	}
}
