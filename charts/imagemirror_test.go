package charts

import (
	"maps"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestJoinConfigImageMirror: joinConfig.imageMirror reaches the join
// config ConfigMap as written, and is absent when empty (joiners then get
// no image mirror).
func TestJoinConfigImageMirror(t *testing.T) {
	const mirror = `{"registry":"mirror.example:5000","upstreams":["registry.k8s.io","docker.io"]}`
	for _, tc := range []struct {
		name, value string
	}{
		{"none", ""},
		{"set", mirror},
	} {
		t.Run(tc.name, func(t *testing.T) {
			values := maps.Clone(testValues["gatehouse-joinservice"])
			join := maps.Clone(values["joinConfig"].(map[string]any))
			join["imageMirror"] = tc.value
			values["joinConfig"] = join
			manifest, err := render(t, "gatehouse-joinservice", values)
			if err != nil {
				t.Fatal(err)
			}
			var got *string
			for doc := range strings.SplitSeq(manifest, "\n---\n") {
				var cm struct {
					Kind     string
					Metadata struct{ Name string }
					Data     map[string]string
				}
				if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
					t.Fatal(err)
				}
				if cm.Kind == "ConfigMap" && cm.Metadata.Name == "gatehouse-join-config" {
					if v, ok := cm.Data["imageMirror"]; ok {
						got = &v
					} else {
						got = new(string)
						*got = "<absent>"
					}
				}
			}
			want := tc.value
			if want == "" {
				want = "<absent>"
			}
			if got == nil || *got != want {
				t.Fatalf("the join config's imageMirror is %v, want %s", got, want)
			}
		})
	}
}
