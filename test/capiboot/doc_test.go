// Package capiboot boots the Cluster API bootstrap provider's attested data
// on a real machine: the provider (cmd/gatehouse-capi-bootstrap) runs
// against a local cluster (`gatehouse mini up`) holding Cluster API's
// CRDs and renders a worker Machine's cloud-config; the local cluster acts
// as the infrastructure provider (`mini node add --provider qemu
// --user-data`): a VM of the node image on the cluster's bridge gets the
// data on a NoCloud seed disk and boots it with real cloud-init, and the
// machine joins through the join service with no secret in its data
// (docs/capi.md, "Booting the data on a real machine"). Data pinning
// another CA is refused by the machine before it asks for anything.
//
// It needs root and the node image (GATEHOUSE_NODE_IMAGE, from
// hack/node-image.sh), and boots two VMs one after the other.
package capiboot
