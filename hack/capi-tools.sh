#!/usr/bin/env bash
# Builds the pinned upstream Cluster API programs from the separate tools
# module in hack/capi-tools, into a cache directory outside the repository
# keyed by that module's content:
#   cabpk       upstream CABPK, the kubeadm bootstrap provider's manager
#               (sigs.k8s.io/cluster-api/bootstrap/kubeadm), for bench/capi.sh
#   clusterctl  sigs.k8s.io/cluster-api/cmd/clusterctl, to check our provider's
#               clusterctl metadata
# A second run with the binaries present is a no-op.
#
# Usage: hack/capi-tools.sh            build if needed, print the bin directory
# Env:   GATEHOUSE_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tools="$here/capi-tools"
cache_root=${GATEHOUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse}
# The version comes from the pin, so a bump changes it and the key both.
CAPI_VERSION=$(cd "$tools" && go list -m -f '{{.Version}}' sigs.k8s.io/cluster-api)
[[ -n "$CAPI_VERSION" ]] || { echo "[capi-tools] no sigs.k8s.io/cluster-api pin in $tools/go.mod" >&2; exit 1; }
# The tools module's content is part of the key, so a changed pin or this
# script's build steps rebuild.
key=$(cat "$tools/go.mod" "$tools/go.sum" "$tools"/*.go "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
bin="$cache_root/capi-tools/$CAPI_VERSION-$key/bin"

log() { printf '[capi-tools] %s\n' "$*" >&2; }

cached() {
	if [[ -f "$bin/.complete" ]]; then
		log "cached: $bin"
		echo "$bin"
		exit 0
	fi
}
cached
# One build at a time; a run that waited finds the other's result.
mkdir -p "$cache_root/capi-tools"
exec 9>"$cache_root/capi-tools/.lock"
flock 9
cached

log "building Cluster API $CAPI_VERSION cabpk and clusterctl into $bin (cold: ~3 min on 2 cores)"
tmp="$bin.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

# What upstream's Makefile stamps into sigs.k8s.io/cluster-api/version, so
# `clusterctl version` and CABPK's startup log name the release.
minor=${CAPI_VERSION#v1.}
minor=${minor%%.*}
pkg=sigs.k8s.io/cluster-api/version
ldflags=(-s -w
	"-X '$pkg.gitVersion=$CAPI_VERSION'"
	"-X '$pkg.gitMajor=1'"
	"-X '$pkg.gitMinor=$minor'"
	"-X '$pkg.gitTreeState=clean'"
	"-X '$pkg.buildDate=1970-01-01T00:00:00Z'"
)

cd "$tools"
log "downloading modules"
go mod download
start=$SECONDS
log "compiling cabpk"
CGO_ENABLED=0 go build -trimpath -ldflags "${ldflags[*]}" -o "$tmp/cabpk" sigs.k8s.io/cluster-api/bootstrap/kubeadm
log "compiled cabpk in $((SECONDS - start))s"
start=$SECONDS
log "compiling clusterctl"
CGO_ENABLED=0 go build -trimpath -ldflags "${ldflags[*]}" -o "$tmp/clusterctl" sigs.k8s.io/cluster-api/cmd/clusterctl
log "compiled clusterctl in $((SECONDS - start))s"

log "checking versions"
got=$("$tmp/clusterctl" version -o short)
[[ "$got" == "$CAPI_VERSION" ]] || { log "clusterctl version printed $got, want $CAPI_VERSION"; exit 1; }
"$tmp/cabpk" --help >/dev/null 2>&1 || { log "cabpk --help failed"; exit 1; }

touch "$tmp/.complete"
rm -rf "$bin"
mkdir -p "$(dirname "$bin")"
mv "$tmp" "$bin"
trap - EXIT
log "done: $bin"
echo "$bin"
