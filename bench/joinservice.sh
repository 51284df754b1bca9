#!/usr/bin/env bash
# Join service load benchmark (docs/benchmarks.md): 200 simulated nodes join
# concurrently against a real kube-apiserver + kube-controller-manager with
# the real key service, and in the same run the raw rate at which that API
# server accepts 200 concurrent bootstrap token Secret creations.
# Usage: bench/joinservice.sh [rounds per run, default 5x] [runs, default 3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$(hack/kube-binaries.sh)}
go test -run '^$' -bench 'BenchmarkJoinStorm' -benchtime "${1:-5x}" -count "${2:-3}" ./joinservice/
