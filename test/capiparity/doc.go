// Package capiparity holds the parity test of Gatehouse's Cluster API
// bootstrap provider (capi/) against upstream CABPK's own renderers
// (sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/cloudinit and
// .../pkg/ignition). It is a module of its own so that the main module does
// not depend on upstream's renderers; docs/capi-parity.md describes it and
// lists every difference it holds.
package capiparity
