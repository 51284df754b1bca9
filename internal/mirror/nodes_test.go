package mirror

import (
	"reflect"
	"strings"
	"testing"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

func TestNodeImageMirror(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *Mirror
		want *componentsv1.ImageMirror
	}{
		{"no mirror", nil, nil},
		{"files only", &Mirror{Files: "https://mirror.example"}, nil},
		{"registry", &Mirror{Registry: "mirror.example:5000"}, &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: []string{"registry.k8s.io", "docker.io"}}},
		{"plain http", &Mirror{Registry: "10.0.0.1:5000/k8s", PlainHTTP: true}, &componentsv1.ImageMirror{Registry: "10.0.0.1:5000/k8s", PlainHttp: true, Upstreams: []string{"registry.k8s.io", "docker.io"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.m.NodeImageMirror()
			if (got == nil) != (tc.want == nil) || (got != nil && (got.GetRegistry() != tc.want.GetRegistry() || got.GetPlainHttp() != tc.want.GetPlainHttp() || !reflect.DeepEqual(got.GetUpstreams(), tc.want.GetUpstreams()))) {
				t.Errorf("NodeImageMirror() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestContainerdHostsFiles(t *testing.T) {
	upstreams := []string{"registry.k8s.io", "docker.io"}
	for _, tc := range []struct {
		name    string
		im      *componentsv1.ImageMirror
		want    map[string][]string // upstream → lines its hosts.toml holds
		wantErr string
	}{
		{name: "none", im: nil},
		{name: "https", im: &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: upstreams}, want: map[string][]string{
			"registry.k8s.io": {`server = "https://registry.k8s.io"`, `[host."https://mirror.example:5000/v2/registry.k8s.io"]`, "override_path = true"},
			"docker.io":       {`server = "https://registry-1.docker.io"`, `[host."https://mirror.example:5000/v2/docker.io"]`},
		}},
		{name: "plain http with prefix", im: &componentsv1.ImageMirror{Registry: "10.88.1.1:5000/m", PlainHttp: true, Upstreams: []string{"registry.k8s.io"}}, want: map[string][]string{
			"registry.k8s.io": {`[host."http://10.88.1.1:5000/v2/m/registry.k8s.io"]`},
			"10.88.1.1:5000":  {`server = "http://10.88.1.1:5000"`, `[host."http://10.88.1.1:5000"]`},
		}},
		{name: "plain http mirror as its own upstream", im: &componentsv1.ImageMirror{Registry: "10.88.1.1:5000", PlainHttp: true, Upstreams: []string{"10.88.1.1:5000"}}, wantErr: "is the mirror itself"},
		{name: "empty registry", im: &componentsv1.ImageMirror{Upstreams: upstreams}, wantErr: "registry is empty"},
		{name: "registry with scheme", im: &componentsv1.ImageMirror{Registry: "https://mirror.example", Upstreams: upstreams}, wantErr: `registry "https://mirror.example"`},
		{name: "no upstream", im: &componentsv1.ImageMirror{Registry: "mirror.example:5000"}, wantErr: "0 upstreams"},
		{name: "upstream escaping the directory", im: &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: []string{"../../etc"}}, wantErr: `upstream "../../etc"`},
		{name: "upstream with a path", im: &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: []string{"ghcr.io/x"}}, wantErr: `upstream "ghcr.io/x"`},
		{name: "dot upstream", im: &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: []string{".."}}, wantErr: `upstream ".."`},
		{name: "duplicate", im: &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: []string{"docker.io", "docker.io"}}, wantErr: "listed twice"},
		{name: "too many", im: &componentsv1.ImageMirror{Registry: "mirror.example:5000", Upstreams: make([]string, 17)}, wantErr: "17 upstreams"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := ContainerdHostsFiles(tc.im)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				if files != nil {
					t.Errorf("files %v returned with the error", files)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(files) != len(tc.want) {
				t.Fatalf("files for %d upstreams, want %d: %v", len(files), len(tc.want), files)
			}
			for upstream, data := range files {
				// containerd 1.6 refuses a hosts.toml without a host table
				// ("invalid `host` tree").
				if !strings.Contains(string(data), "\n[host.\"") {
					t.Errorf("%s/hosts.toml has no host table:\n%s", upstream, data)
				}
			}
			for upstream, lines := range tc.want {
				for _, line := range lines {
					if !strings.Contains(string(files[upstream]), line) {
						t.Errorf("%s/hosts.toml lacks %q:\n%s", upstream, line, files[upstream])
					}
				}
			}
		})
	}
}

func TestChartImageValues(t *testing.T) {
	chart := func(repo string) map[string]any {
		return map[string]any{"image": map[string]any{"repository": repo, "tag": "v1", "digest": "sha256:" + strings.Repeat("a", 64)}}
	}
	for _, tc := range []struct {
		name    string
		m       *Mirror
		values  map[string]any
		want    string // the mapped repository; "" for no values
		wantErr bool
	}{
		{name: "no mirror", values: chart("docker.io/local/gatehouse-joinservice")},
		{name: "files only", m: &Mirror{Files: "https://mirror.example"}, values: chart("docker.io/local/gatehouse-joinservice")},
		{name: "docker hub", m: &Mirror{Registry: "mirror.example:5000"}, values: chart("docker.io/local/gatehouse-joinservice"), want: "mirror.example:5000/docker.io/local/gatehouse-joinservice"},
		{name: "ghcr with prefix", m: &Mirror{Registry: "mirror.example/m"}, values: chart("ghcr.io/gatehouse-dev/gatehouse-keyservice"), want: "mirror.example/m/ghcr.io/gatehouse-dev/gatehouse-keyservice"},
		{name: "already mirrored", m: &Mirror{Registry: "mirror.example:5000"}, values: chart("mirror.example:5000/docker.io/local/gatehouse-joinservice")},
		{name: "no image", m: &Mirror{Registry: "mirror.example:5000"}, values: map[string]any{}},
		{name: "bad repository", m: &Mirror{Registry: "mirror.example:5000"}, values: chart("Not A Repo"), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.m.ChartImageValues(tc.values)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want one: %v", err, tc.wantErr)
			}
			if tc.want == "" {
				if got != nil {
					t.Errorf("values %v, want none", got)
				}
				return
			}
			img, _ := got["image"].(map[string]any)
			if img["repository"] != tc.want || len(img) != 1 || len(got) != 1 {
				t.Errorf("values %v, want only image.repository %s (tag and digest kept as they are)", got, tc.want)
			}
		})
	}
}
