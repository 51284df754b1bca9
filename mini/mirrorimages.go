package mini

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

// With Options.MirrorImages the local cluster also takes its images as a
// cluster without internet does (docs/install-airgapped.md): the cluster
// configuration's mirror names the cluster's registry (plain HTTP on the
// bridge), mini up pushes the local images there at the mirror's paths of
// their upstream names (registry.k8s.io/kube-apiserver:<version> at
// <registry>/registry.k8s.io/kube-apiserver:<version>, the Gatehouse
// services' at <registry>/docker.io/local/…), and the nodes start with an
// empty containerd: every image is pulled from the mirror, through the
// containerd hosts files the bootstrapper writes from the image mirror it
// is sent (InitRequest, join ticket) into nodeContainerdHostsDir. VM nodes
// too: the node image's containerd reads its hosts files from the same
// directory on its state disk, and their drop-in keeps it
// (vmContainerdConfig).

// nodeContainerdHostsDir is a mirror-images node's containerd config_path:
// in its private /etc/gatehouse, as on the node image's state disk (the
// image's config_path and its bootstrapper's --containerd-hosts-dir;
// TestVMContainerdDropIn keeps them equal).
const nodeContainerdHostsDir = "/etc/gatehouse/containerd/certs.d"

// clusterMirror is the cluster configuration's mirror: the file server,
// and with MirrorImages the cluster's registry.
func (o Options) clusterMirror() *mirror.Mirror {
	m := &mirror.Mirror{Files: o.Network.mirrorURL()}
	if o.MirrorImages {
		m.Registry, m.PlainHTTP = o.Network.RegistryAddress(), true
	}
	return m
}

// upstreamName is the name a local image stands for: the control plane's
// images (docker.io/local/<name>:<tag>, kubeadm's names with the local
// repository) are registry.k8s.io's, CoreDNS under its coredns/coredns
// path; the Gatehouse services' keep their names.
func upstreamName(local string) (string, error) {
	tag, err := name.NewTag(local)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", local, err)
	}
	repo := strings.TrimPrefix(tag.RepositoryStr(), "local/")
	switch {
	case strings.HasPrefix(repo, "gatehouse-"):
		return local, nil
	case repo == "coredns":
		return "registry.k8s.io/coredns/coredns:" + tag.TagStr(), nil
	default:
		return "registry.k8s.io/" + repo + ":" + tag.TagStr(), nil
	}
}

// pushMirrorImages pushes every image of the node images' archive to the
// cluster's registry at the mirror's name of its upstream name. Without
// MirrorImages it does nothing.
func (u *up) pushMirrorImages(ctx context.Context, imgs *nodeImages) error {
	if !u.opts.MirrorImages {
		return nil
	}
	m := u.opts.clusterMirror()
	u.p.step("Pushing the node images to the mirror's registry %s (the nodes pull every image from it)", m.Registry)
	opener := func() (io.ReadCloser, error) { return os.Open(imgs.archive) }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		return fmt.Errorf("reading the node images %s: %w", imgs.archive, err)
	}
	for _, desc := range manifest {
		for _, t := range desc.RepoTags {
			src, err := name.NewTag(t)
			if err != nil {
				return err
			}
			img, err := tarball.Image(opener, &src)
			if err != nil {
				return fmt.Errorf("%s: image %s: %w", imgs.archive, t, err)
			}
			upstream, err := upstreamName(t)
			if err != nil {
				return err
			}
			mapped, err := m.Image(upstream)
			if err != nil {
				return err
			}
			dst, err := name.NewTag(mapped, name.Insecure)
			if err != nil {
				return err
			}
			if err := push(ctx, dst, img); err != nil {
				return err
			}
			u.p.detail("%s as %s", upstream, dst)
		}
	}
	return nil
}

// mirrorImagesSpec makes s a node that pulls its images from the mirror:
// no images imported, no containerd seed.
func (u *up) mirrorImagesSpec(s *NodeSpec) {
	if u.opts.MirrorImages {
		s.MirrorImages, s.ImagesSeed = true, ""
	}
}

// containerdMirrorConfig is containerdConfig for a node that pulls from
// the mirror: the upstream pause image, and containerd's hosts files in
// config_path instead of the registry mirror.
const containerdMirrorConfig = containerdBaseConfig + `  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "%[2]s"
`

// nodeContainerdConfig is the node's containerd configuration.
func nodeContainerdConfig(spec *NodeSpec) ([]byte, error) {
	if !spec.MirrorImages {
		return fmt.Appendf(nil, containerdConfig, spec.PauseImage, spec.Network.RegistryAddress()), nil
	}
	pause, err := upstreamName(spec.PauseImage)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, containerdMirrorConfig, pause, nodeContainerdHostsDir), nil
}

// mirrorImagesArgs are the bootstrapper flags of a node that pulls from
// the mirror: kubeadm pulls what it lacks, and the image mirror's hosts
// files go to containerd's config_path. Later flags win.
func mirrorImagesArgs(spec *NodeSpec) []string {
	if !spec.MirrorImages {
		return nil
	}
	return []string{"--image-pull-policy", "IfNotPresent", "--containerd-hosts-dir", nodeContainerdHostsDir}
}

// mirrorChartValues are values with the chart's image on the mirror's
// registry (pulled when missing), and for the join service the join
// config's imageMirror; values unchanged without MirrorImages.
func mirrorChartValues(opts Options, c *chart.Chart, release string, values map[string]any) (map[string]any, error) {
	if !opts.MirrorImages {
		return values, nil
	}
	m := opts.clusterMirror()
	over, err := m.ChartImageValues(c.Values)
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", release, err)
	}
	if over == nil {
		over = map[string]any{}
	}
	img, _ := over["image"].(map[string]any)
	if img == nil {
		img = map[string]any{}
		over["image"] = img
	}
	img["pullPolicy"] = "IfNotPresent"
	if release == "gatehouse-joinservice" {
		im, err := mirror.MarshalImageMirror(m.NodeImageMirror())
		if err != nil {
			return nil, err
		}
		over["joinConfig"] = map[string]any{"imageMirror": im}
	}
	return chartutil.MergeTables(over, values), nil
}
