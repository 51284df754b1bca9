package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"

	"github.com/gatehouse-dev/gatehouse/bootstrapper"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

// TestInitImageMirror: with the cluster configuration's mirror.registry,
// gatehouse init sends the first control plane the image mirror, and the
// node's containerd pulls registry.k8s.io and docker.io images (the pause
// image among them) from the mirror's mapped paths.
func TestInitImageMirror(t *testing.T) {
	n := startNode(t)
	n.patch = func(config string) string {
		return config + "\nmirror:\n  registry: 10.88.1.1:5000\n  plainHTTP: true\n"
	}
	dir := t.TempDir()
	t.Chdir(dir)
	config := writeConfig(t, dir, n, false)
	if err := os.WriteFile("secret", []byte(n.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "init", "--config", config, "--node", n.addr, "--init-secret-file", "secret")
	for upstream, want := range map[string]string{
		"registry.k8s.io": `[host."http://10.88.1.1:5000/v2/registry.k8s.io"]`,
		"docker.io":       `[host."http://10.88.1.1:5000/v2/docker.io"]`,
	} {
		data, err := os.ReadFile(filepath.Join(n.root, bootstrapper.DefaultContainerdHostsDir, upstream, "hosts.toml"))
		if err != nil || !strings.Contains(string(data), want) {
			t.Errorf("the node's %s hosts.toml: %v\n%s", upstream, err, data)
		}
	}
}

// TestMirrorReleaseValues: with a mirror registry, upgrade apply --config
// points each Gatehouse chart's image at the mirror (tag and digest left to
// the chart) and gives joiners the image mirror; without one it sets
// nothing; values the Kubernetes roll sets merge with them.
func TestMirrorReleaseValues(t *testing.T) {
	charts := map[string]*chart.Chart{
		"gatehouse-joinservice": {Values: map[string]any{"image": map[string]any{"repository": "docker.io/local/gatehouse-joinservice", "tag": "local"}}},
		"gatehouse-keyservice":  {Values: map[string]any{"image": map[string]any{"repository": "ghcr.io/gatehouse-dev/gatehouse-keyservice", "tag": "v1", "digest": "sha256:" + strings.Repeat("a", 64)}}},
	}
	for _, tc := range []struct {
		name string
		m    *mirror.Mirror
		want map[string]string // release → image.repository; nil: no values
	}{
		{name: "no mirror"},
		{name: "files only", m: &mirror.Mirror{Files: "https://mirror.example"}},
		{name: "registry", m: &mirror.Mirror{Registry: "mirror.example:5000"}, want: map[string]string{
			"gatehouse-joinservice": "mirror.example:5000/docker.io/local/gatehouse-joinservice",
			"gatehouse-keyservice":  "mirror.example:5000/ghcr.io/gatehouse-dev/gatehouse-keyservice",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			values, err := mirrorReleaseValues(tc.m, charts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if values != nil {
					t.Fatalf("values %v, want none", values)
				}
				return
			}
			for release, repo := range tc.want {
				img, _ := values[release]["image"].(map[string]any)
				if img["repository"] != repo || len(img) != 1 {
					t.Errorf("%s: image values %v, want only repository %s", release, img, repo)
				}
			}
			// The Kubernetes roll's join config merges with the mirror's.
			join := mergeReleaseValues(values[joinServiceRelease], map[string]any{"joinConfig": map[string]any{"kubernetesVersion": "v1.36.4"}})
			jc, _ := join["joinConfig"].(map[string]any)
			if jc["kubernetesVersion"] != "v1.36.4" || !strings.Contains(jc["imageMirror"].(string), `"registry":"mirror.example:5000"`) {
				t.Errorf("join config values %v, want the version and the image mirror", jc)
			}
			if _, changed := values[joinServiceRelease]["joinConfig"].(map[string]any)["kubernetesVersion"]; changed {
				t.Error("merging changed its input")
			}
		})
	}
}
