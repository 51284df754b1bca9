#!/usr/bin/env bash
# Builds the project's binaries into bin/ (make build: every ./cmd; make
# mini-up: the ones the local cluster runs, given as arguments), saying how
# far the build is while it runs: cold, it compiles about 1,300 to 1,700
# packages.
#
# Usage: hack/build.sh [package...]   (default ./cmd/...)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/progress.sh
source hack/lib/progress.sh
pkgs=("${@:-./cmd/...}")
total=$(progress_run build "finding the packages of bin/ (the first time, downloading their modules)" 0 go list -deps "${pkgs[@]}" | wc -l)
names=$(go list -f '{{.Name}} {{.ImportPath}}' "${pkgs[@]}" | awk '$1 == "main" { n = split($2, p, "/"); printf "%s%s", sep, p[n]; sep = ", " }')
progress_run build "compiling bin/ ($names)" "$total" go build -v -o bin/ "${pkgs[@]}"
