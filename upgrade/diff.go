package upgrade

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"sigs.k8s.io/yaml"
)

// diff describes how the rendered manifest after differs from before, per
// object (kind namespace/name): added, removed, or changed with a unified
// diff of its YAML.
func diff(before, after string) string {
	old, cur := objects(before), objects(after)
	var keys []string
	for k := range old {
		keys = append(keys, k)
	}
	for k := range cur {
		if _, ok := old[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		o, inOld := old[k]
		n, inNew := cur[k]
		switch {
		case !inOld:
			fmt.Fprintf(&b, "  + %s (added)\n", k)
		case !inNew:
			fmt.Fprintf(&b, "  - %s (removed)\n", k)
		case o != n:
			fmt.Fprintf(&b, "  ~ %s (changed)\n", k)
			d, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
				A: difflib.SplitLines(o), B: difflib.SplitLines(n), FromFile: "deployed", ToFile: "new", Context: 2,
			})
			for _, line := range strings.Split(strings.TrimRight(d, "\n"), "\n") {
				b.WriteString("      " + line + "\n")
			}
		}
	}
	if b.Len() == 0 {
		return "  (no changes to the rendered objects)\n"
	}
	return b.String()
}

// objects splits a rendered manifest into its objects by key.
func objects(manifest string) map[string]string {
	out := map[string]string{}
	for _, doc := range strings.Split(manifest, "\n---") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind == "" {
			continue
		}
		out[fmt.Sprintf("%s %s/%s", meta.Kind, meta.Metadata.Namespace, meta.Metadata.Name)] = strings.TrimSpace(doc) + "\n"
	}
	return out
}
