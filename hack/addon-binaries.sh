#!/usr/bin/env bash
# Builds the local cluster's add-on binaries from their pinned Go modules:
# CoreDNS (the version kubeadm v1.36.4 deploys) and the CNCF distribution
# registry, into a cache directory outside the repository keyed by the
# versions. A second run with the binaries present is a no-op.
#
# Usage: hack/addon-binaries.sh           build if needed, print the bin directory
# Env:   GATEHOUSE_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse)
set -euo pipefail

COREDNS_VERSION=v1.14.2      # kubeadm v1.36.4's CoreDNS (kubeadm config images list)
REGISTRY_VERSION=v3.1.0      # github.com/distribution/distribution/v3

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/progress.sh
source "$here/lib/progress.sh"
cache_root=${GATEHOUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse}
bin="$cache_root/addons/coredns-$COREDNS_VERSION-registry-$REGISTRY_VERSION/bin"

log() { printf '[addon-binaries] %s\n' "$*" >&2; }

cached() {
	if [[ -f "$bin/.complete" ]]; then
		log "cached: $bin"
		echo "$bin"
		exit 0
	fi
}
cached
mkdir -p "$cache_root/addons"
exec 9>"$cache_root/addons/.lock"
flock 9
cached

log "building CoreDNS $COREDNS_VERSION and the distribution registry $REGISTRY_VERSION from source into $bin, once (cold: about 3 min on 2 cores)"
tmp="$bin.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
# go install pkg@version builds with the module's own go.mod and go.sum,
# checked against the checksum database.
for pkg in "github.com/coredns/coredns@$COREDNS_VERSION" "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"; do
	progress_run addon-binaries "downloading and compiling $pkg" -1 \
		env GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -v -trimpath -ldflags "-s -w" "$pkg"
done
"$tmp/coredns" -version | head -1 >&2
"$tmp/registry" --version >&2

touch "$tmp/.complete"
rm -rf "$bin"
mkdir -p "$(dirname "$bin")"
mv "$tmp" "$bin"
trap - EXIT
log "done: $bin"
echo "$bin"
