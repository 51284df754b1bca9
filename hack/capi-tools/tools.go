//go:build tools

// Package tools pins the Cluster API programs that hack/capi-tools.sh builds:
// upstream CABPK (the kubeadm bootstrap provider's manager), to benchmark our
// provider against, and clusterctl, to check our provider's metadata. Neither
// is a dependency of the main module; this separate module keeps their
// dependency graph out of it. `go mod tidy` sees these imports through the
// tools build tag; nothing compiles this file.
package tools

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
)
