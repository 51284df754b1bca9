package clusterconfig_test

import (
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/internal/attestation/policy"
	"github.com/gatehouse-dev/gatehouse/internal/clusterconfig"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
	"github.com/gatehouse-dev/gatehouse/internal/testkit"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// TestMirror: the generated configuration carries the mirror (or a
// commented example without one), parses back to it, maps every component
// URL of the version to the mirror with its pinned digest, and a malformed
// mirror is refused naming the field.
func TestMirror(t *testing.T) {
	values := func(m *mirror.Mirror) clusterconfig.TemplateValues {
		return clusterconfig.TemplateValues{
			Name: "c", KubernetesVersion: "v1.36.4", ReferenceValues: `{"0": {"expected": "` + strings.Repeat("cd", 32) + `"}}`, PCRs: []int{0, 4, 15},
			RoleReferenceValues: map[policy.Role]string{policy.RoleControlPlane: `{"4": {"expected": "` + strings.Repeat("ab", 32) + `"}}`},
			EKRoots:             string(testkit.NewCA(t, "root").PEM), ServiceCIDR: "10.96.0.0/12", PodCIDR: "10.244.0.0/16",
			Mirror: m,
		}
	}
	release, err := versions.Resolve("v1.36.4")
	if err != nil {
		t.Fatal(err)
	}
	official, err := release.Proto("arm64")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		m    *mirror.Mirror
		err  string
	}{
		{"no mirror", nil, ""},
		{"files and registry", &mirror.Mirror{Files: "https://mirror.example/files", Registry: "mirror.example:5000"}, ""},
		{"files only", &mirror.Mirror{Files: "http://10.88.0.1:5080"}, ""},
		{"files without a scheme", &mirror.Mirror{Files: "mirror.example"}, `mirror: files "mirror.example" is not an http:// or https:// URL`},
		{"registry with a scheme", &mirror.Mirror{Registry: "https://mirror.example"}, `mirror: registry "https://mirror.example": give host[:port][/prefix] without a scheme`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := clusterconfig.Generate(values(tc.m))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Generate() = %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := clusterconfig.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if tc.m == nil {
				if cfg.Mirror != nil || !strings.Contains(string(data), "# mirror:\n#   files: https://mirror.example/files") {
					t.Fatalf("without a mirror: parsed %+v; want none and a commented example in\n%s", cfg.Mirror, data)
				}
			} else if *cfg.Mirror != *tc.m {
				t.Fatalf("mirror parsed back as %+v, want %+v", cfg.Mirror, tc.m)
			}
			got, err := cfg.Components("arm64")
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(official) {
				t.Fatalf("%d components, want %d", len(got), len(official))
			}
			for i, c := range got {
				want := official[i].GetUrl()
				if tc.m != nil {
					want = tc.m.Files + "/" + strings.TrimPrefix(want, "https://")
				}
				if c.GetUrl() != want || c.GetHash() != official[i].GetHash() || c.GetInstallPath() != official[i].GetInstallPath() {
					t.Errorf("component %d = %v, want URL %s with the table's hash and path", i, c, want)
				}
			}
		})
	}
}
