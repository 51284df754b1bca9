// Package vme2e tests VM nodes in the local cluster end to end: a
// namespace control plane made by `gatehouse mini up --mirror-images`, and
// a worker that is a VM of the node image (QEMU, OVMF measuring into its
// own swtpm, the real bootstrapper inside) which joins through the join
// service, pulls every image it runs through the mirror registry, is
// verified continuously, serves a workload, reboots for real with its
// dm-crypt state disk, and is refused and tainted when it boots a changed
// kernel command line.
//
// It needs root and the node image (GATEHOUSE_NODE_IMAGE, from
// hack/node-image.sh). Its tests are built with the vmnodes tag so that
// `go test ./...` leaves them out: `make test` runs them in a step of
// their own after the other tests (`make test-vm`), where the VMs boot
// under TCG emulation on an otherwise idle machine (about 8 min here;
// docs/benchmarks.md, "VM nodes"). TestVMControlPlane, a cluster whose
// control plane is a VM through a power cut and gatehouse recover, also
// needs the vmcontrolplane tag: `make test-vm-controlplane` (16 min).
package vme2e
