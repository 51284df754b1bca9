#!/usr/bin/env bash
# Builds the local cluster's add-on binaries from their pinned Go modules:
# CoreDNS (the version kubeadm v1.36.4 deploys) and the CNCF distribution
# registry, into a cache directory outside the repository keyed by the
# versions and the mains. A second run with the binaries present is a no-op.
#
# Each is built from a module of its own under hack/addons, whose go.mod
# requires the pinned version and whose go.sum is checked: the dependency
# versions are exactly the upstream module's own (no replace directives
# upstream). Each main compiles in only what the local cluster uses, which
# halves the build: CoreDNS with the plugins of kubeadm's Corefile and a few
# a user may add (hack/addons/coredns/main.go), the registry with the
# filesystem storage driver (no Azure, GCS or S3).
#
# Usage: hack/addon-binaries.sh           build if needed, print the bin directory
# Env:   GATEHOUSE_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse)
set -euo pipefail

COREDNS_VERSION=v1.14.2      # kubeadm v1.36.4's CoreDNS (kubeadm config images list)
REGISTRY_VERSION=v3.1.0      # github.com/distribution/distribution/v3

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/progress.sh
source "$here/lib/progress.sh"
addons="$here/addons"
cache_root=${GATEHOUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse}
# The modules' content is part of the key, so a changed main or pin rebuilds.
key=$(cd "$addons" && cat coredns/go.mod coredns/go.sum coredns/*.go registry/go.mod registry/go.sum registry/*.go | sha256sum | cut -c1-12)
bin="$cache_root/addons/coredns-$COREDNS_VERSION-registry-$REGISTRY_VERSION-$key/bin"

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

for m in "coredns github.com/coredns/coredns $COREDNS_VERSION" "registry github.com/distribution/distribution/v3 $REGISTRY_VERSION"; do
	read -r dir module version <<<"$m"
	got=$(cd "$addons/$dir" && go list -m -f '{{.Version}}' "$module")
	[[ "$got" == "$version" ]] || { log "hack/addons/$dir/go.mod requires $module $got, want $version"; exit 1; }
done

log "building CoreDNS $COREDNS_VERSION and the distribution registry $REGISTRY_VERSION from source into $bin, once (cold: about 1.5 min on 2 quiet cores)"
tmp="$bin.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0
for dir in coredns registry; do
	cd "$addons/$dir"
	progress_run addon-binaries "downloading the modules of $dir" 0 go mod download
	total=$(go list -deps . | wc -l)
	progress_run addon-binaries "compiling $dir" "$total" \
		go build -v -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp/$dir" .
done
# The whole output, not piped into head: a writer cut off by head dies of
# SIGPIPE, and pipefail makes that this script's failure.
got=$("$tmp/coredns" -version)
got=${got%%$'\n'*}
[[ "$got" == "CoreDNS-${COREDNS_VERSION#v}" ]] || { log "coredns -version printed $got, want CoreDNS-${COREDNS_VERSION#v}"; exit 1; }
"$tmp/registry" --version >&2

touch "$tmp/.complete"
rm -rf "$bin"
mkdir -p "$(dirname "$bin")"
mv "$tmp" "$bin"
trap - EXIT
log "done: $bin"
echo "$bin"
