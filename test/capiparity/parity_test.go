package capiparity

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

// TestSamplesCoverEveryField fails on a field of upstream's
// KubeadmConfigSpec that no sample sets: a field upstream adds fails it
// until a sample exercises it.
func TestSamplesCoverEveryField(t *testing.T) {
	covered := coveredFields(t)
	var missing []string
	for _, f := range specFields() {
		if len(covered[f]) == 0 {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		t.Errorf("no sample sets these fields of upstream's KubeadmConfigSpec; add samples (samples_test.go) setting them:\n  %s", strings.Join(missing, "\n  "))
	}
	for _, f := range specFields() {
		t.Logf("%s: %s", f, strings.Join(covered[f], "; "))
	}
	t.Logf("%d fields of upstream's KubeadmConfigSpec, each set by a sample", len(specFields()))
}

// coveredFields maps each field path to the samples setting it, format
// included (every sample renders with format set).
func coveredFields(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, s := range samples {
		for _, format := range formatsOf(s) {
			spec, err := upstreamSpec(s, format)
			if err != nil {
				t.Fatalf("sample %q: %v", s.name, err)
			}
			for _, f := range setFields(spec) {
				if !slices.Contains(out[f], s.name) {
					out[f] = append(out[f], s.name)
				}
			}
		}
	}
	return out
}

func formatsOf(s sample) []string {
	if s.only != "" {
		return []string{s.only}
	}
	return []string{cloudConfig, ignitionFmt}
}

// found is a difference with where it occurs.
type found struct {
	format string
	difference
	samples []string
}

// TestParity renders every sample through our controller and renderer and
// through upstream's, in both formats, and holds their differences in
// meaning to the table in differences_test.go: an unlisted difference
// fails, and so does a listed one that no longer occurs.
func TestParity(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	results := map[string]map[string]meanings{cloudConfig: {}, ignitionFmt: {}}
	t.Run("render", func(t *testing.T) {
		for i, s := range samples {
			for _, format := range formatsOf(s) {
				t.Run(format+"/"+s.name, func(t *testing.T) {
					t.Parallel()
					name := fmt.Sprintf("p%02d-%s", i, map[string]string{cloudConfig: "cc", ignitionFmt: "ign"}[format])
					spec, err := upstreamSpec(s, format)
					if err != nil {
						t.Fatal(err)
					}
					cluster := h.cluster(t, name, s.role, spec.ClusterConfiguration.Etcd.External.IsDefined())
					ours := h.ours(t, cluster, name, s, format)
					upstream := h.upstream(t, cluster, s, format)
					m, err := models(s, format, cluster.Name, ours, upstream)
					if err != nil {
						t.Fatalf("reading the data: %v", err)
					}
					mu.Lock()
					results[format][s.name] = m
					mu.Unlock()
				})
			}
		}
	})
	if t.Failed() {
		return
	}

	// A sample whose data reads the same as its base's on both sides sets
	// fields the comparison does not see.
	for _, format := range []string{cloudConfig, ignitionFmt} {
		for _, s := range samples {
			m, ok := results[format][s.name]
			b := results[format][base(s.role)]
			if !ok || s.name == base(s.role) || m.failure != nil || b.failure != nil {
				continue
			}
			var ours, upstream []difference
			diffValues("", m.ours, b.ours, &ours)
			diffValues("", m.upstream, b.upstream, &upstream)
			if len(ours) == 0 && len(upstream) == 0 {
				t.Errorf("%s: sample %q reads the same as %s in both renderers' data: the comparison does not see what it sets", format, s.name, base(s.role))
			}
		}
	}

	// Each sample's differences beyond its role's base.
	var all []found
	index := map[string]int{}
	for _, format := range []string{cloudConfig, ignitionFmt} {
		for _, s := range samples {
			res, ok := results[format][s.name]
			if !ok {
				continue
			}
			baseDiffs := map[difference]bool{}
			if s.name != base(s.role) {
				for _, d := range results[format][base(s.role)].differences() {
					baseDiffs[d] = true
				}
			}
			for _, d := range res.differences() {
				if baseDiffs[d] {
					continue
				}
				key := format + "\x00" + d.Path + "\x00" + d.Ours + "\x00" + d.Upstream
				if i, ok := index[key]; ok {
					all[i].samples = append(all[i].samples, s.name)
					continue
				}
				index[key] = len(all)
				all = append(all, found{format, d, []string{s.name}})
			}
		}
	}

	listed := map[string]bool{}
	for i, k := range differences {
		key := k.Format + "\x00" + k.Path + "\x00" + k.Ours + "\x00" + k.Upstream
		if listed[key] {
			t.Errorf("differences[%d] (%s %s) is listed twice", i, k.Format, k.Path)
		}
		listed[key] = true
		j, ok := index[key]
		switch {
		case !ok:
			t.Errorf("listed difference no longer occurs (fixed? remove it from differences_test.go, then run go test -run TestDocument -update):\n  %s %s: ours %s, upstream %s (%s)",
				k.Format, k.Path, k.Ours, k.Upstream, strings.Join(k.Samples, "; "))
		case !slices.Equal(sorted(k.Samples), sorted(all[j].samples)):
			t.Errorf("listed difference %s %s occurs in other samples than listed:\n  listed: %q\n  found:  %q",
				k.Format, k.Path, sorted(k.Samples), sorted(all[j].samples))
		}
	}
	var unlisted []string
	for _, f := range all {
		key := f.format + "\x00" + f.Path + "\x00" + f.Ours + "\x00" + f.Upstream
		if !listed[key] {
			unlisted = append(unlisted, fmt.Sprintf("\t{Format: %q, Path: %q,\n\t\tOurs: %q,\n\t\tUpstream: %q,\n\t\tSamples: %#v,\n\t\tStatus: open, Note: \"\"},",
				f.format, f.Path, f.Ours, f.Upstream, f.samples))
		}
	}
	if len(unlisted) > 0 {
		t.Errorf("%d differences in meaning are not listed in differences_test.go; fix them, or list them with their reason:\n%s",
			len(unlisted), strings.Join(unlisted, "\n"))
	}
	t.Logf("%d samples, %d differences (cloud-config and Ignition)", len(samples), len(all))
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return out
}
