package controller

import (
	"maps"
	"path"
	"slices"

	"github.com/gatehouse-dev/gatehouse/capi/render"
	"github.com/gatehouse-dev/gatehouse/internal/mirror"
)

// containerdHostsDir is containerd's conventional config_path (containerd
// docs/hosts.md), which Cluster API's image-builder images set.
const containerdHostsDir = "/etc/containerd/certs.d"

// containerdHostsFiles are the files that make a Machine's containerd pull
// every image of registry.k8s.io and docker.io (the pause image among
// them) from the mirror's registry (docs/install-airgapped.md):
// <containerdHostsDir>/<upstream>/hosts.toml, in a fixed order. None
// without a registry.
func containerdHostsFiles(m *mirror.Mirror) ([]render.File, error) {
	hosts, err := mirror.ContainerdHostsFiles(m.NodeImageMirror())
	if err != nil {
		return nil, err
	}
	files := make([]render.File, 0, len(hosts))
	for _, upstream := range slices.Sorted(maps.Keys(hosts)) {
		files = append(files, render.File{Path: path.Join(containerdHostsDir, upstream, "hosts.toml"), Content: string(hosts[upstream]), Permissions: "0644"})
	}
	return files, nil
}
