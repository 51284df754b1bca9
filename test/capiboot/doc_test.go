// Package capiboot boots the Cluster API bootstrap provider's attested data
// on a real machine: the provider (cmd/gatehouse-capi-bootstrap) runs
// against a local cluster (`gatehouse mini up`) holding Cluster API's
// CRDs, renders a worker Machine's cloud-config, the test turns it into a
// NoCloud seed disk as an infrastructure provider would hand it over, and
// a VM of the node image (image/qemu) boots it with real cloud-init: the
// machine joins through the join service with no secret in its data
// (docs/capi.md, "Booting the data on a real machine").
//
// It needs root and the node image (GATEHOUSE_NODE_IMAGE, from
// hack/node-image.sh), and boots two VMs under TCG emulation one after the
// other. The booting test is built with the vmnodes tag (`make test-vm`):
// it does not pass yet (the VM is on QEMU's user network, and the join
// service refuses a node whose address is not the one it connects from; it
// moves to the cluster bridge next), so it is not part of `make test`.
package capiboot
