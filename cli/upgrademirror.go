package cli

import (
	"fmt"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

// mirrorReleaseValues are the values that put the Gatehouse releases on
// the mirror's registry (docs/install-airgapped.md), by release name: each
// chart's image.repository mapped from its chart's default (tag and digest
// kept, so a pinned digest still decides what runs), and the join config's
// imageMirror, which joiners' containerd pulls every image from. nil
// without a registry.
func mirrorReleaseValues(m *mirror.Mirror, charts map[string]*chart.Chart) (map[string]map[string]any, error) {
	if m == nil || m.Registry == "" {
		return nil, nil
	}
	out := map[string]map[string]any{}
	for name, c := range charts {
		values, err := m.ChartImageValues(c.Values)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", name, err)
		}
		if values != nil {
			out[name] = values
		}
	}
	im, err := mirror.MarshalImageMirror(m.NodeImageMirror())
	if err != nil {
		return nil, err
	}
	out[joinServiceRelease] = mergeReleaseValues(out[joinServiceRelease], map[string]any{"joinConfig": map[string]any{"imageMirror": im}})
	return out, nil
}

// mergeReleaseValues merges over into values, nested maps key by key
// (Helm's chartutil.MergeTables), over winning; neither is modified.
func mergeReleaseValues(values, over map[string]any) map[string]any {
	return chartutil.MergeTables(copyTable(over), copyTable(values))
}

// copyTable copies t's nested maps, so merging never writes into t.
func copyTable(t map[string]any) map[string]any {
	out := make(map[string]any, len(t))
	for k, v := range t {
		if sub, ok := v.(map[string]any); ok {
			v = copyTable(sub)
		}
		out[k] = v
	}
	return out
}
