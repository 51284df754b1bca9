#!/usr/bin/env bash
# Builds the project's binaries into bin/ (make build), saying how far the
# build is while it runs: cold, it compiles about 1,500 packages.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/progress.sh
source hack/lib/progress.sh
total=$(progress_run build "finding the packages of bin/ (the first time, downloading their modules)" 0 go list -deps ./cmd/... | wc -l)
progress_run build "compiling bin/ (gatehouse, gatehouse-bootstrapper, gatehouse-joinservice, gatehouse-keyservice, …)" "$total" \
	go build -v -o bin/ ./cmd/...
