#!/usr/bin/env bash
# Cluster API bootstrap provider benchmark (bench/capi): upstream CABPK of the
# pinned sigs.k8s.io/cluster-api (hack/capi-tools.sh) and ours
# (cmd/gatehouse-capi-bootstrap) each turn the same 1000 worker
# KubeadmConfigs into data Secrets against a fresh real kube-apiserver + etcd;
# reports per provider the wall time from its start, its CPU time and peak
# RSS, the API server's and etcd's CPU time, and ours/upstream ratios.
# A provider whose binary is missing is skipped with a message saying so.
#
# Usage: bench/capi.sh [rounds per provider, default 1x] [runs, default 1]
# Env:   GATEHOUSE_BENCH_CAPI_MACHINES  fewer Machines, for a smoke run of the harness
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$(hack/kube-binaries.sh)}
export GATEHOUSE_BENCH_CABPK=${GATEHOUSE_BENCH_CABPK:-$(hack/capi-tools.sh)/cabpk}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
if [[ -z ${GATEHOUSE_BENCH_CAPI_BOOTSTRAP:-} ]]; then
  # Without the binary the benchmark skips our side and says so.
  export GATEHOUSE_BENCH_CAPI_BOOTSTRAP="$bin/gatehouse-capi-bootstrap"
  if [[ ! -d cmd/gatehouse-capi-bootstrap ]]; then
    echo "no cmd/gatehouse-capi-bootstrap: only upstream CABPK is measured" >&2
  elif ! go build -o "$GATEHOUSE_BENCH_CAPI_BOOTSTRAP" ./cmd/gatehouse-capi-bootstrap; then
    echo "building cmd/gatehouse-capi-bootstrap failed: only upstream CABPK is measured" >&2
  fi
fi
go test -c -o "$bin/capi.test" ./bench/capi/
# Other load skews every number; say how much there was.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
cd bench/capi
"$bin/capi.test" -test.run '^$' -test.bench 'BenchmarkReconcile1000' -test.v \
  -test.benchtime "${1:-1x}" -test.count "${2:-1}" -test.timeout 60m 2>&1 | grep -Ev '^[IWE][0-9]{4} '
