package bootstrapper

import (
	"cmp"
	"fmt"
	"path"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

// DefaultContainerdHostsDir is containerd's conventional config_path
// (containerd docs/hosts.md): the node's containerd configuration must
// name it for the image mirror to take effect.
const DefaultContainerdHostsDir = "/etc/containerd/certs.d"

// writeImageMirror makes the node's containerd pull every image of im's
// upstreams from im's registry (docs/install-airgapped.md): it writes
// <ContainerdHostsDir>/<upstream>/hosts.toml for each, before kubeadm
// pulls anything. containerd reads these files at each pull, so no
// restart is needed. A nil im writes nothing (containerd's own
// configuration stays). im comes from the InitRequest or the join ticket,
// both from the cluster's configuration, never from the node.
func (s *Machine) writeImageMirror(im *componentsv1.ImageMirror) error {
	files, err := mirror.ContainerdHostsFiles(im)
	if err != nil || files == nil {
		return err
	}
	dir := cmp.Or(s.ContainerdHostsDir, DefaultContainerdHostsDir)
	for upstream, data := range files {
		p := path.Join(dir, upstream, "hosts.toml")
		if err := s.writeFile(p, data, 0o644); err != nil {
			return fmt.Errorf("configuring containerd to pull %s images from the mirror %s: %w", upstream, im.GetRegistry(), err)
		}
	}
	s.Log.Info("containerd pulls images from the mirror", "registry", im.GetRegistry(), "plainHTTP", im.GetPlainHttp(), "upstreams", im.GetUpstreams(), "dir", dir)
	return nil
}
