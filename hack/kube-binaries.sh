#!/usr/bin/env bash
# Builds the pinned Kubernetes binaries (one multi-call "kube" binary plus a
# symlink per component) and etcd from the separate tools module in hack/tools,
# into a cache directory outside the repository keyed by the versions and the
# tools module's content. A second run with the binaries present is a no-op.
#
# Usage: hack/kube-binaries.sh [MINOR]    build if needed, print the bin directory
#        MINOR is 1.36 (the default: the versions table's newest release) or
#        1.35, the release before it, which the upgrade test starts from
#        (docs/upgrades.md); each has a tools module of its own
#        (hack/tools, hack/tools/k8s-1.35: one module holds one
#        k8s.io/kubernetes), and 1.35's directory links the default's etcd.
# Env:   GATEHOUSE_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse)
set -euo pipefail

ETCD_VERSION=v3.6.8
COMPONENTS=(kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/progress.sh
source "$here/lib/progress.sh"
etcd_from=""
case "${1:-1.36}" in
1.36) KUBE_VERSION=v1.36.4 tools="$here/tools" ;;
1.35)
	KUBE_VERSION=v1.35.8 tools="$here/tools/k8s-1.35"
	etcd_from=$("$here/kube-binaries.sh")
	;;
*)
	echo "[kube-binaries] unknown Kubernetes minor version $1: use 1.36 (the default) or 1.35" >&2
	exit 2
	;;
esac
cache_root=${GATEHOUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse}
# The tools module's content is part of the key, so a changed main or pin
# rebuilds (cat follows k8s-1.35's link to the shared main); so is the etcd
# a linked build comes with.
key=$(cd "$tools" && { cat go.mod go.sum $(find cmd -name '*.go' | sort); [[ -z "$etcd_from" ]] || echo "$etcd_from"; } | sha256sum | cut -c1-12)
bin="$cache_root/kubernetes/$KUBE_VERSION-etcd-$ETCD_VERSION-$key/bin"

log() { printf '[kube-binaries] %s\n' "$*" >&2; }

cached() {
	if [[ -f "$bin/.complete" ]]; then
		log "cached: $bin"
		echo "$bin"
		exit 0
	fi
}
cached
# One build at a time; a run that waited finds the other's result.
mkdir -p "$cache_root/kubernetes"
exec 9>"$cache_root/kubernetes/.lock"
flock 9
cached

what="Kubernetes $KUBE_VERSION and etcd $ETCD_VERSION"
[[ -z "$etcd_from" ]] || what="Kubernetes $KUBE_VERSION (etcd linked from $etcd_from)"
log "building $what from source into $bin, once (cold: about 5 min on 2 quiet cores)"
tmp="$bin.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
ldflags=(-s -w)
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=(
		"-X '$pkg.gitVersion=$KUBE_VERSION'"
		"-X '$pkg.gitMajor=1'"
		"-X '$pkg.gitMinor=$minor'"
		"-X '$pkg.gitTreeState=clean'"
		"-X '$pkg.buildDate=1970-01-01T00:00:00Z'"
	)
done

cd "$tools"
export CGO_ENABLED=0
progress_run kube-binaries "downloading the modules of Kubernetes and etcd" 0 go mod download
total=$(go list -deps ./cmd/kube | wc -l)
progress_run kube-binaries "compiling kube (kubelet, kubeadm, kubectl, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy in one binary)" "$total" \
	go build -v -trimpath -ldflags "${ldflags[*]}" -o "$tmp/kube" ./cmd/kube
if [[ -n "$etcd_from" ]]; then
	ln -s "$etcd_from/etcd" "$tmp/etcd"
else
	total=$(go list -deps ./cmd/etcd | wc -l)
	progress_run kube-binaries "compiling etcd (most of its packages are kube's, compiled already)" "$total" \
		go build -v -trimpath -ldflags "-s -w" -o "$tmp/etcd" ./cmd/etcd
fi
for c in "${COMPONENTS[@]}"; do
	ln -s kube "$tmp/$c"
done

log "checking versions"
got=$("$tmp/kubeadm" version -o short)
[[ "$got" == "$KUBE_VERSION" ]] || { log "kubeadm version printed $got, want $KUBE_VERSION"; exit 1; }
# Whole outputs, not piped into head: a writer cut off by head dies of
# SIGPIPE, and pipefail makes that this script's failure.
got=$("$tmp/etcd" --version)
got=${got%%$'\n'*}
[[ "$got" == "etcd Version: ${ETCD_VERSION#v}" ]] || { log "etcd --version printed $got, want etcd Version: ${ETCD_VERSION#v}"; exit 1; }

touch "$tmp/.complete"
rm -rf "$bin"
mkdir -p "$(dirname "$bin")"
mv "$tmp" "$bin"
trap - EXIT
log "done: $bin"
echo "$bin"
