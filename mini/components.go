package mini

import (
	"path/filepath"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
	"github.com/gatehouse-dev/gatehouse/mini/images"
)

// miniComponents are the versions table's components of the cluster's
// Kubernetes version (names, order, install paths), each pointing through
// a file:// URL with its real sha256 at the local build of that binary:
// the local cluster does not assume access to the official downloads.
// crictl and the CNI plugins have no local build; the nodes use Debian's
// CNI plugins.
func miniComponents(version, kubeBin string) ([]*componentsv1.Component, error) {
	release, err := versions.Resolve(version)
	if err != nil {
		return nil, err
	}
	list, err := release.Components("amd64")
	if err != nil {
		return nil, err
	}
	kube := filepath.Join(kubeBin, "kube")
	d, err := images.FileDigest(kube)
	if err != nil {
		return nil, err
	}
	var out []*componentsv1.Component
	for _, c := range list {
		switch c.Name {
		case "kubelet", "kubeadm", "kubectl":
			out = append(out, &componentsv1.Component{Url: "file://" + kube, Hash: "sha256:" + d, InstallPath: c.InstallPath})
		}
	}
	return out, nil
}
