#!/usr/bin/env bash
# Builds the node image from this checkout (gatehouse image build: cached by
# content, so a second run with nothing changed takes seconds) and prints
# the directory holding its disks, UKIs, manifest and signed reference
# values (docs/image.md). The real-boot test (test/realboot) boots it.
#
# Usage: hack/node-image.sh     build if needed, print the image directory
# Env:   GATEHOUSE_CACHE         cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${GATEHOUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse}
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$("$here/kube-binaries.sh")}

log() { printf '[node-image] %s\n' "$*" >&2; }

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd "$here/.." && go build -o "$bin/gatehouse" ./cmd/gatehouse)
log "gatehouse image build (cold: debootstrap and apt fetch 200 packages, then about 6 min of assembly; warm: seconds)"
# Progress goes to standard error; the JSON result to standard output.
result=$(cd "$here/.." && "$bin/gatehouse" image build --cache-dir "$cache_root/image" --output json)
dir=$(printf '%s' "$result" | sed -n 's/^  "dir": "\(.*\)",$/\1/p')
if [[ -z "$dir" || ! -f "$dir/reference-values.signed.json" ]]; then
	log "the build printed no image directory with signed values: $result"
	exit 1
fi
log "node image: $dir"
echo "$dir"
