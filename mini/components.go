package mini

import (
	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
	"github.com/gatehouse-dev/gatehouse/internal/versions"
)

// miniComponents are the versions table's components of the cluster's
// Kubernetes version as the local build in kubeBin provides them
// (versions.Release.LocalBuild): the local cluster does not assume
// access to the official downloads. crictl and the CNI plugins have no
// local build; the nodes use Debian's CNI plugins.
func miniComponents(version, kubeBin string) ([]*componentsv1.Component, error) {
	release, err := versions.Resolve(version)
	if err != nil {
		return nil, err
	}
	return release.LocalBuild("amd64", kubeBin)
}
