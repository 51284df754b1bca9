package mirror

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"google.golang.org/protobuf/encoding/protojson"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

// nodeUpstreams are the registries whose pulls a node's containerd sends to
// the mirror's registry: kubeadm's (the control plane's and the pause
// image) and Docker Hub (where the Gatehouse charts' images and most
// workloads are named).
func nodeUpstreams() []string { return []string{kubeadmRegistry, "docker.io"} }

// maxUpstreams bounds an ImageMirror's upstream list.
const maxUpstreams = 16

// NodeImageMirror returns what a node needs to pull every image from the
// mirror's registry (InitRequest.image_mirror, the join ticket's
// image_mirror): the registry, PlainHTTP and NodeUpstreams. nil without
// Registry.
func (m *Mirror) NodeImageMirror() *componentsv1.ImageMirror {
	if m == nil || m.Registry == "" {
		return nil
	}
	return &componentsv1.ImageMirror{Registry: m.Registry, PlainHttp: m.PlainHTTP, Upstreams: nodeUpstreams()}
}

// ContainerdHostsFiles checks im (a node's ImageMirror, from its InitRequest
// or join ticket) and returns containerd's hosts.toml for each upstream,
// keyed by the upstream's directory name under containerd's config_path
// (<config_path>/<upstream>/hosts.toml; containerd docs/hosts.md), and
// with PlainHttp one for the mirror's own host[:port] (server
// http://<host>), so images named by the mirror itself, as kubeadm names
// the control plane's, are pulled over HTTP too. A nil im returns no
// files. Errors name the field that is wrong.
func ContainerdHostsFiles(im *componentsv1.ImageMirror) (map[string][]byte, error) {
	if im == nil {
		return nil, nil
	}
	m := &Mirror{Registry: im.GetRegistry(), PlainHTTP: im.GetPlainHttp()}
	if im.GetRegistry() == "" {
		return nil, errors.New("image mirror: registry is empty")
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("image mirror: %w", err)
	}
	if len(im.GetUpstreams()) == 0 || len(im.GetUpstreams()) > maxUpstreams {
		return nil, fmt.Errorf("image mirror: %d upstreams, want 1 to %d", len(im.GetUpstreams()), maxUpstreams)
	}
	files := make(map[string][]byte, len(im.GetUpstreams()))
	for _, upstream := range im.GetUpstreams() {
		// The directory is the host as image names spell it: a path
		// element, never "..", a slash or empty.
		if _, err := name.NewRegistry(upstream, name.StrictValidation); err != nil || upstream == "" || strings.ContainsAny(upstream, `/\`) || strings.HasPrefix(upstream, ".") {
			return nil, fmt.Errorf("image mirror: upstream %q is not a registry host[:port], such as registry.k8s.io", upstream)
		}
		if _, dup := files[upstream]; dup {
			return nil, fmt.Errorf("image mirror: upstream %q is listed twice", upstream)
		}
		data, err := m.ContainerdHosts(upstream, im.GetPlainHttp())
		if err != nil {
			return nil, fmt.Errorf("image mirror: %w", err)
		}
		files[upstream] = data
	}
	if im.GetPlainHttp() {
		// Images named by the mirror itself (kubeadm's, through
		// imageRepository) are pulled from it over HTTP too.
		host, _, _ := strings.Cut(im.GetRegistry(), "/")
		if _, dup := files[host]; dup {
			return nil, fmt.Errorf("image mirror: upstream %q is the mirror itself", host)
		}
		// containerd 1.6 refuses a hosts.toml without a host table.
		files[host] = fmt.Appendf(nil, `# Pulls of images named by the mirror come from it over plain HTTP
# (docs/install-airgapped.md). containerd checks every blob's digest.
server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
`, host)
	}
	return files, nil
}

// ChartImageValues returns the values that point a chart's image at the
// mirror: {"image": {"repository": <registry>/<original registry>/<path>}}
// from the chart's image.repository in values (its defaults, or the
// release's values); the tag and a digest (image.digest) are kept as they
// are, so a pinned digest still decides what runs. nil without Registry or
// when values name no image.repository.
func (m *Mirror) ChartImageValues(values map[string]any) (map[string]any, error) {
	if m == nil || m.Registry == "" {
		return nil, nil
	}
	img, _ := values["image"].(map[string]any)
	repo, _ := img["repository"].(string)
	if repo == "" {
		return nil, nil
	}
	if strings.HasPrefix(repo, m.Registry+"/") {
		// Already the mirror's (values written by an earlier run).
		return nil, nil
	}
	parsed, err := name.NewRepository(repo)
	if err != nil {
		return nil, fmt.Errorf("mirroring image.repository %q: %w", repo, err)
	}
	return map[string]any{"image": map[string]any{"repository": m.Repository(parsed)}}, nil
}

// MarshalImageMirror is im in protobuf JSON form, one line, for the join
// config's imageMirror key (docs/joinservice.md): {"registry":
// "mirror.example:5000","plainHttp":true,"upstreams":["registry.k8s.io",
// "docker.io"]}. "" for a nil im.
func MarshalImageMirror(im *componentsv1.ImageMirror) (string, error) {
	if im == nil {
		return "", nil
	}
	data, err := protojson.Marshal(im)
	if err != nil {
		return "", fmt.Errorf("encoding the image mirror: %w", err)
	}
	return string(data), nil
}

// ParseImageMirror reads data in MarshalImageMirror's form and checks it as
// ContainerdHostsFiles does; blank data is no mirror (nil). Unknown fields
// are refused.
func ParseImageMirror(data string) (*componentsv1.ImageMirror, error) {
	if strings.TrimSpace(data) == "" {
		return nil, nil
	}
	im := &componentsv1.ImageMirror{}
	if err := protojson.Unmarshal([]byte(data), im); err != nil {
		return nil, fmt.Errorf(`not an image mirror such as {"registry":"mirror.example:5000","upstreams":["registry.k8s.io","docker.io"]}: %w`, err)
	}
	if _, err := ContainerdHostsFiles(im); err != nil {
		return nil, err
	}
	return im, nil
}
