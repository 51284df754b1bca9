#!/usr/bin/env bash
# Continuous attestation scale benchmark (docs/benchmarks.md): N simulated
# nodes (GATEHOUSE_BENCH_REATTEST_NODES, default 500), each a Node of a real
# kube-apiserver with its own loopback address and a node-name binding,
# serve real TPM evidence over attested TLS; the loop re-verifies them all,
# round after round. It reports the server side's CPU per re-verification
# beside the plain verification of one evidence in the same run, the p99
# check latency, the round time and the Node status writes.
#
# The simulated nodes run in a rig process of their own. With two or more
# CPUs the server side (the loop, kube-apiserver, etcd) is pinned to CPU 0
# and the rig to the others, so the rig's TPM quotes and TLS servers do not
# take the server's CPU; set GATEHOUSE_BENCH_PIN=0 to let everything share
# all CPUs.
# Usage: bench/reattest.sh [rounds per run, default 5x] [runs, default 3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$(hack/kube-binaries.sh)}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go test -c -o "$bin/continuous.test" ./joinservice/continuous/
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
echo "${GATEHOUSE_BENCH_REATTEST_NODES:-500} nodes"
cd joinservice/continuous
"${pin[@]}" "$bin/continuous.test" -test.run '^$' -test.bench 'BenchmarkReattest' \
  -test.benchtime "${1:-5x}" -test.count "${2:-3}" "${@:3}" 2>&1 | grep -Ev '^[IWE][0-9]{4} '
