#!/usr/bin/env bash
# Builds the tests' Prometheus server and promtool from their pinned Go module
# (github.com/prometheus/prometheus v0.316.0, Prometheus 3.16.0, Apache-2.0,
# run by tests only, never linked into Gatehouse): promtool checks and
# unit-tests the charts' alerting rules (charts/alerts_test.go), Prometheus
# scrapes the local cluster in the e2e (test/e2e/prometheus_test.go). Built
# with the module's remove_all_sd tag (only static, file and HTTP discovery;
# the tests use static targets), which drops the cloud SDKs from the server,
# and without the web UI's assets (the tests use the HTTP API only). Cached
# outside the repository, keyed by the tools module's content; a second run is
# a no-op.
#
# Usage: hack/prometheus-binary.sh    build if needed, print the directory
#                                     holding prometheus and promtool
# Env:   GATEHOUSE_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse)
set -euo pipefail

PROMETHEUS_MODULE_VERSION=v0.316.0
# The Prometheus release that module version is (its VERSION file), which
# `prometheus --version` prints.
PROMETHEUS_VERSION=3.16.0
BUILD_FLAGS=(-tags remove_all_sd -trimpath -buildvcs=false -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION")

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/progress.sh
source "$here/lib/progress.sh"
# shellcheck source=lib/cache.sh
source "$here/lib/cache.sh"
src="$here/tools/prometheus"
cache_root=${GATEHOUSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse}
dir="$cache_root/prometheus/$PROMETHEUS_MODULE_VERSION-$(cache_key "$src" "${BUILD_FLAGS[*]}")"

log() { printf '[prometheus-binary] %s\n' "$*" >&2; }

cache_enter prometheus-binary "$dir" "$dir"
tmp=$cache_tmp

got=$(cd "$src" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
[[ "$got" == "$PROMETHEUS_MODULE_VERSION" ]] || { log "hack/tools/prometheus/go.mod requires github.com/prometheus/prometheus $got, want $PROMETHEUS_MODULE_VERSION"; exit 1; }
log "building the tests' Prometheus and promtool (module $PROMETHEUS_MODULE_VERSION) into $dir, once (cold: about 5 min on 2 cores)"
cd "$src"
export CGO_ENABLED=0
pkgs=(github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
# Only the modules the build needs (about 1.1 GB cold, 17 s here), not
# `go mod download`'s whole graph (1.9 GB: every service discovery's SDK).
progress_run prometheus-binary "downloading the modules the build needs" 0 \
	go list -tags remove_all_sd -deps "${pkgs[@]}" >"$tmp/packages"
total=$(wc -l <"$tmp/packages")
rm "$tmp/packages"
progress_run prometheus-binary "compiling prometheus and promtool" "$total" \
	go build -v "${BUILD_FLAGS[@]}" -o "$tmp/" "${pkgs[@]}"
cache_commit prometheus-binary "$dir" "$dir"
