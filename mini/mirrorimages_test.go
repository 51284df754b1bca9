package mini

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
)

func TestUpstreamName(t *testing.T) {
	for _, tc := range []struct{ local, want string }{
		{"docker.io/local/kube-apiserver:v1.36.4", "registry.k8s.io/kube-apiserver:v1.36.4"},
		{"docker.io/local/pause:3.10.2", "registry.k8s.io/pause:3.10.2"},
		{"docker.io/local/etcd:3.6.8-0", "registry.k8s.io/etcd:3.6.8-0"},
		{"docker.io/local/coredns:v1.14.2", "registry.k8s.io/coredns/coredns:v1.14.2"},
		{"docker.io/local/gatehouse-joinservice:local", "docker.io/local/gatehouse-joinservice:local"},
	} {
		got, err := upstreamName(tc.local)
		if err != nil || got != tc.want {
			t.Errorf("upstreamName(%s) = %q, %v; want %s", tc.local, got, err, tc.want)
		}
	}
}

// TestNodeContainerdConfig: a mirror-images node's containerd (the
// host's 1.6, as the nodes run it) reads its hosts files from the node's
// config_path, has no registry mirror of its own, and runs the upstream
// pause image; other nodes keep the local registry mirror.
func TestNodeContainerdConfig(t *testing.T) {
	containerd, err := exec.LookPath("containerd")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("containerd is missing (make setup-test installs it): %v", err)
		}
		t.Skipf("containerd is missing (make setup-test installs it): %v", err)
	}
	nw := Network(7)
	for _, tc := range []struct {
		name      string
		spec      NodeSpec
		want, not []string
	}{
		{"imported images", NodeSpec{Network: nw, PauseImage: "docker.io/local/pause:3.10.2"},
			[]string{`sandbox_image = "docker.io/local/pause:3.10.2"`, `endpoint = ["http://` + nw.RegistryAddress() + `"]`}, []string{`config_path = "/etc/gatehouse`}},
		{"mirror images", NodeSpec{Network: nw, PauseImage: "docker.io/local/pause:3.10.2", MirrorImages: true},
			[]string{`sandbox_image = "registry.k8s.io/pause:3.10.2"`, `config_path = "` + nodeContainerdHostsDir + `"`}, []string{"docker.io/local", "endpoint = [\"http"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := nodeContainerdConfig(&tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			config := filepath.Join(t.TempDir(), "containerd.toml")
			if err := os.WriteFile(config, data, 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.CommandContext(t.Context(), containerd, "--config", config, "config", "dump").CombinedOutput()
			if err != nil {
				t.Fatalf("containerd config dump: %v\n%s", err, out)
			}
			for _, want := range tc.want {
				if !strings.Contains(string(out), want) {
					t.Errorf("containerd's configuration lacks %s:\n%s", want, out)
				}
			}
			for _, not := range tc.not {
				if strings.Contains(string(out), not) {
					t.Errorf("containerd's configuration has %s:\n%s", not, out)
				}
			}
		})
	}
}

// TestMirrorChartValues: with MirrorImages each chart's image comes from
// the cluster's registry at its mirror path and is pulled, and the join
// config carries the image mirror; without, values stay as they are.
func TestMirrorChartValues(t *testing.T) {
	c := &chart.Chart{Values: map[string]any{"image": map[string]any{"repository": "docker.io/local/gatehouse-joinservice", "tag": "local"}}}
	values := map[string]any{"image": map[string]any{"pullPolicy": "Never"}, "joinConfig": map[string]any{"kubernetesVersion": "v1.36.4"}}
	opts := Options{Network: Network(7)}
	got, err := mirrorChartValues(opts, c, "gatehouse-joinservice", values)
	if err != nil || got["image"].(map[string]any)["pullPolicy"] != "Never" || got["image"].(map[string]any)["repository"] != nil {
		t.Fatalf("without MirrorImages: %v, %v", got, err)
	}
	opts.MirrorImages = true
	got, err = mirrorChartValues(opts, c, "gatehouse-joinservice", values)
	if err != nil {
		t.Fatal(err)
	}
	img := got["image"].(map[string]any)
	if img["repository"] != opts.Network.RegistryAddress()+"/docker.io/local/gatehouse-joinservice" || img["pullPolicy"] != "IfNotPresent" {
		t.Errorf("image values %v", img)
	}
	join := got["joinConfig"].(map[string]any)
	if join["kubernetesVersion"] != "v1.36.4" || !strings.Contains(join["imageMirror"].(string), `"registry":"`+opts.Network.RegistryAddress()+`"`) {
		t.Errorf("join config values %v", join)
	}
}
