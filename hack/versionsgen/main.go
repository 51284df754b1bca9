// Command versionsgen generates internal/versions/zz_generated.go from
// internal/versions/kubernetes-components.yaml: for the newest patch
// release of each Kubernetes minor version in the data file, the ordered
// components a node installs (kubelet, kubeadm, kubectl, crictl, CNI
// plugins) with their URLs and sha256 digests for linux/amd64 and
// linux/arm64. Run it with `go generate ./internal/versions`.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"log"
	"os"
	"regexp"
	"slices"
	"strconv"
	"text/template"

	"golang.org/x/mod/semver"
	"sigs.k8s.io/yaml"
)

type artifact struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
}

// byArch is one artifact per architecture.
type byArch map[string]artifact

type data struct {
	Kubernetes map[string]map[string]byArch `json:"kubernetes"`
	Crictl     map[string]byArch            `json:"crictl"`
	CNIPlugins map[string]byArch            `json:"cni-plugins"`
}

var archs = []string{"amd64", "arm64"}

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

type component struct {
	Name, URL, Hash, InstallPath string
	Extract                      bool
}

type release struct {
	Version    string
	Crictl     string
	CNIPlugins string
	Components map[string][]component
}

func main() {
	in := flag.String("in", "kubernetes-components.yaml", "data file")
	out := flag.String("out", "zz_generated.go", "generated Go file")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		log.Fatal(err)
	}
}

func run(in, out string) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var d data
	if err := yaml.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	releases, err := build(d)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, struct {
		Releases []release
		Archs    []string
	}{releases, archs}); err != nil {
		return err
	}
	src, err := format.Source(buf.Bytes())
	if err != nil {
		return fmt.Errorf("formatting generated code: %w", err)
	}
	return os.WriteFile(out, src, 0o644) //nolint:gosec // generated source, world-readable like the rest of the repository
}

// build picks the newest patch of each minor, newest minor first, with the
// crictl of the same minor (else the closest) and the newest CNI plugins.
func build(d data) ([]release, error) {
	newest := map[string]string{}
	for v := range d.Kubernetes {
		if !semver.IsValid(v) || semver.Prerelease(v) != "" {
			return nil, fmt.Errorf("kubernetes version %q is not vMAJOR.MINOR.PATCH", v)
		}
		mm := semver.MajorMinor(v)
		if cur, ok := newest[mm]; !ok || semver.Compare(v, cur) > 0 {
			newest[mm] = v
		}
	}
	if len(newest) == 0 {
		return nil, errors.New("no kubernetes versions")
	}
	cni := newestOf(d.CNIPlugins)
	if cni == "" {
		return nil, errors.New("no cni-plugins versions")
	}
	var out []release
	for _, v := range newest {
		crictl := closestCrictl(d.Crictl, semver.MajorMinor(v))
		if crictl == "" {
			return nil, errors.New("no crictl versions")
		}
		r := release{Version: v, Crictl: crictl, CNIPlugins: cni, Components: map[string][]component{}}
		for _, arch := range archs {
			var list []component
			for _, name := range []string{"kubelet", "kubeadm", "kubectl"} {
				a, err := pick(d.Kubernetes[v][name], name+" "+v, arch)
				if err != nil {
					return nil, err
				}
				list = append(list, component{Name: name, URL: a.URL, Hash: "sha256:" + a.SHA256, InstallPath: "/usr/local/bin/" + name})
			}
			a, err := pick(d.Crictl[crictl], "crictl "+crictl, arch)
			if err != nil {
				return nil, err
			}
			list = append(list, component{Name: "crictl", URL: a.URL, Hash: "sha256:" + a.SHA256, InstallPath: "/usr/local/bin", Extract: true})
			if a, err = pick(d.CNIPlugins[cni], "cni-plugins "+cni, arch); err != nil {
				return nil, err
			}
			list = append(list, component{Name: "cni-plugins", URL: a.URL, Hash: "sha256:" + a.SHA256, InstallPath: "/opt/cni/bin", Extract: true})
			r.Components[arch] = list
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b release) int { return semver.Compare(b.Version, a.Version) })
	return out, nil
}

func pick(b byArch, what, arch string) (artifact, error) {
	a, ok := b[arch]
	if !ok {
		return artifact{}, fmt.Errorf("%s has no %s artifact", what, arch)
	}
	if !digestRE.MatchString(a.SHA256) {
		return artifact{}, fmt.Errorf("%s %s: sha256 %q is not 64 lowercase hex digits", what, arch, a.SHA256)
	}
	return a, nil
}

func newestOf(m map[string]byArch) string {
	best := ""
	for v := range m {
		if best == "" || semver.Compare(v, best) > 0 {
			best = v
		}
	}
	return best
}

// closestCrictl returns the newest crictl of minor mm, else the crictl
// whose minor is closest to it (crictl talks CRI v1 to every supported
// runtime, and cri-tools publishes one release per Kubernetes minor).
func closestCrictl(m map[string]byArch, mm string) string {
	best, bestDist := "", 0
	minor := func(v string) int {
		n, _ := strconv.Atoi(semver.MajorMinor(v)[len("v1."):])
		return n
	}
	for v := range m {
		d := minor(v) - minor(mm)
		if d < 0 {
			d = -d
		}
		if best == "" || d < bestDist || (d == bestDist && semver.Compare(v, best) > 0) {
			best, bestDist = v, d
		}
	}
	return best
}

var tmpl = template.Must(template.New("").Parse(`// Code generated by hack/versionsgen from kubernetes-components.yaml; DO NOT EDIT.

package versions

// releases are the supported Kubernetes releases, newest first.
var releases = []Release{
{{- range .Releases}}
	{
		Version: "{{.Version}}",
		Crictl: "{{.Crictl}}",
		CNIPlugins: "{{.CNIPlugins}}",
		components: map[string][]Component{
		{{- range $arch, $list := .Components}}
			"{{$arch}}": {
			{{- range $list}}
				{Name: "{{.Name}}", URL: "{{.URL}}", Hash: "{{.Hash}}", InstallPath: "{{.InstallPath}}", Extract: {{.Extract}}},
			{{- end}}
			},
		{{- end}}
		},
	},
{{- end}}
}
`))
