#!/usr/bin/env bash
# Prepares a fresh Debian machine (as root).
#
#   hack/setup.sh         what the local cluster (make mini-up) needs: the
#                         Debian packages it and the build use, the pinned
#                         Kubernetes binaries and the cluster's add-ons
#                         (CoreDNS, registry)
#   hack/setup.sh --vm    that, and what VM nodes need (make mini-up-vm):
#                         QEMU, OVMF, and the Debian tools that build the
#                         node image they boot (make image) and their
#                         NoCloud seed disks
#   hack/setup.sh --test  all of that, and what only the tests need (make
#                         test): the tests' Debian packages (make release's
#                         C cross toolchain among them), the pinned Go
#                         tools (MinIO among them), the pinned upstream
#                         Cluster API programs (hack/capi-tools.sh), and
#                         Prometheus and promtool (hack/prometheus-binary.sh)
#
# Idempotent and fast when everything is already there. Every step longer
# than a few seconds says what it does while it runs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/progress.sh
source "$here/lib/progress.sh"

test=false vm=false
case "${1:-}" in
"") ;;
--vm) vm=true ;;
--test) test=true vm=true ;;
*)
	echo "usage: $0 [--vm|--test]" >&2
	exit 2
	;;
esac

# Debian packages the build and the local cluster use: the C toolchain for
# cgo (PKCS#11 in the key service), and what mini.CheckPrerequisites names.
PACKAGES=(ca-certificates git make gcc libc6-dev util-linux mount iproute2 iptables
	swtpm swtpm-tools cryptsetup-bin containerd runc containernetworking-plugins haproxy)
# Debian packages VM nodes use (mini's qemu provider, `gatehouse image run`,
# the VM tests): QEMU, OVMF and the systemd stub, objcopy, sfdisk and mtools;
# debootstrap, squashfs-tools, dosfstools and zstd for `gatehouse image
# build` (make image); dosfstools and mtools make a VM's NoCloud seed disk.
VM_PACKAGES=(qemu-system-x86 qemu-utils ovmf systemd-boot-efi binutils fdisk mtools
	debootstrap squashfs-tools dosfstools zstd)
# Debian packages only the tests use: OpenSSL's headers for the TPM
# simulator's cgo, SoftHSM2 for PKCS#11, cloud-init for `cloud-init schema`.
TEST_PACKAGES=(libssl-dev softhsm2 cloud-init)
# The release's cgo binaries for the other architecture (make release and
# its reproducibility test): Debian's cross gcc and glibc, and QEMU's
# user-mode emulator that runs them in the test.
case "$(dpkg --print-architecture 2>/dev/null || uname -m)" in
arm64 | aarch64) TEST_PACKAGES+=(gcc-x86-64-linux-gnu libc6-dev-amd64-cross qemu-user) ;;
*) TEST_PACKAGES+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user) ;;
esac

log() { printf '[setup] %s\n' "$*" >&2; }

wanted=("${PACKAGES[@]}")
if $vm; then wanted+=("${VM_PACKAGES[@]}"); fi
if $test; then wanted+=("${TEST_PACKAGES[@]}"); fi
missing=()
for p in "${wanted[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		log "missing Debian packages: ${missing[*]}; run as root or install them with apt-get"
		exit 1
	fi
	start=$SECONDS
	log "installing Debian packages: ${missing[*]} (apt-get prints each download and install)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >&2
	apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
	log "Debian packages installed in $(progress_elapsed $((SECONDS - start)))"
fi

command -v go >/dev/null || { log "Go is not on PATH; install Go 1.26 (see docs/development.md)"; exit 1; }

# Each in an assignment of its own, so that its failure stops this script
# (a failing $(...) inside another command's arguments would not).
dir=$("$here/kube-binaries.sh")
log "Kubernetes binaries: $dir"
dir=$("$here/addon-binaries.sh")
log "Local cluster add-ons (CoreDNS, registry): $dir"
if $test; then
	# The upgrade test's cluster starts at the previous minor version.
	dir=$("$here/kube-binaries.sh" 1.35)
	log "Kubernetes binaries of the previous minor version: $dir"
	dir=$("$here/go-tools.sh")
	log "Go tools: $dir"
	dir=$("$here/capi-tools.sh")
	log "Cluster API tools (upstream CABPK, clusterctl): $dir"
	dir=$("$here/vault-binary.sh")
	log "Vault server of the external KMS tests: $dir"
	dir=$("$here/prometheus-binary.sh")
	log "Prometheus and promtool of the alert tests: $dir"
fi
