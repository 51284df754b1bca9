#!/usr/bin/env bash
# Join service load benchmark (docs/benchmarks.md): 200 simulated nodes join
# concurrently against a real kube-apiserver + kube-controller-manager with
# the real key service, and in the same run the raw rate at which that API
# server accepts 200 concurrent bootstrap token Secret creations.
#
# The simulated nodes run in a rig process of their own. With two or more
# CPUs the server side (join service, key service, API server, etcd,
# controller manager) is pinned to CPU 0 and the rig to the others, so the
# rig's TPM quotes and TLS clients do not take the server's CPU; set
# GATEHOUSE_BENCH_PIN=0 to let everything share all CPUs.
# GATEHOUSE_BENCH_PROFILE=<absolute dir> writes CPU profiles of the service
# process and kube-apiserver for each phase (profiling costs CPU; take the
# figures from a run without it).
# Usage: bench/joinservice.sh [rounds per run, default 5x] [runs, default 3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$(hack/kube-binaries.sh)}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go test -c -o "$bin/joinservice.test" ./joinservice/
pin=()
cpus=$(nproc)
if [[ ${GATEHOUSE_BENCH_PIN:-1} != 0 && $cpus -ge 2 ]]; then
  export GATEHOUSE_BENCH_RIG_CPUS="1-$((cpus - 1))"
  pin=(taskset --cpu-list 0)
  echo "server side on CPU 0, rig on CPUs $GATEHOUSE_BENCH_RIG_CPUS"
else
  unset GATEHOUSE_BENCH_RIG_CPUS
  echo "server side and rig share all $cpus CPUs"
fi
cd joinservice
# The machine may be shared: the load before and after says how much.
echo "load before: $(uptime)"
"${pin[@]}" "$bin/joinservice.test" -test.run '^$' -test.bench 'BenchmarkJoinStorm' \
  -test.benchtime "${1:-5x}" -test.count "${2:-3}" 2>&1 | grep -Ev '^[IWE][0-9]{4} '
echo "load after: $(uptime)"
