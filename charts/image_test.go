package charts

import (
	"maps"
	"strings"
	"testing"
)

// The charts run their image by tag (gatehouse mini's local images) or,
// when image.digest is set (a release's charts), by repository@digest.
func TestImageByDigest(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for _, name := range Names {
		tests := []struct {
			name  string
			image map[string]any
			want  string
		}{
			{"by tag", nil, `image: "docker.io/local/` + name + `:local"`},
			{"by digest", map[string]any{"repository": "ghcr.io/gatehouse-dev/" + name, "digest": digest},
				`image: "ghcr.io/gatehouse-dev/` + name + `@` + digest + `"`},
		}
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				values := maps.Clone(testValues[name])
				if tt.image != nil {
					values["image"] = tt.image
				}
				manifest, err := render(t, name, values)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(manifest, tt.want) {
					t.Errorf("the manifest lacks %s:\n%s", tt.want, manifest)
				}
			})
		}
	}
}
