#!/usr/bin/env bash
# Prepares a fresh Debian machine (as root) for building and testing Gatehouse:
# Debian packages, the pinned Go tools, the pinned Kubernetes binaries, the
# local cluster's add-ons (CoreDNS, registry) and the pinned upstream Cluster
# API programs (hack/capi-tools.sh).
# Idempotent and fast when everything is already there.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Debian packages the build, the tests and the local cluster use.
PACKAGES=(ca-certificates git make gcc util-linux mount iproute2 iptables libssl-dev swtpm swtpm-tools softhsm2 cryptsetup-bin containerd runc containernetworking-plugins haproxy cloud-init)

log() { printf '[setup] %s\n' "$*" >&2; }

missing=()
for p in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		log "missing Debian packages: ${missing[*]}; run as root or install them with apt-get"
		exit 1
	fi
	log "installing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

command -v go >/dev/null || { log "Go is not on PATH; install Go 1.26 (see docs/development.md)"; exit 1; }

log "Go tools: $("$here/go-tools.sh")"
log "Kubernetes binaries: $("$here/kube-binaries.sh")"
log "Local cluster add-ons (CoreDNS, registry): $("$here/addon-binaries.sh")"
log "Cluster API tools (upstream CABPK, clusterctl): $("$here/capi-tools.sh")"
