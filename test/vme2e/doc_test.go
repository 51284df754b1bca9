// Package vme2e tests VM nodes in the local cluster end to end: a
// namespace control plane made by `gatehouse mini up`, and a worker that is
// a VM of the node image (QEMU, OVMF measuring into its own swtpm, the
// real bootstrapper inside) which joins through the join service, is
// verified continuously, reboots for real with its dm-crypt state disk,
// and is refused and tainted when it boots a changed kernel command line.
//
// It needs root, the node image (GATEHOUSE_NODE_IMAGE, from
// hack/node-image.sh) and 30 to 90 minutes of TCG emulation. Its tests are built
// with the vmnodes tag (`make test-vm`): they are not yet part of `make test`,
// whose budget they do not fit under emulation (issue 36, docs/benchmarks.md).
package vme2e
