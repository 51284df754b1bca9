#!/usr/bin/env bash
# Encryption at rest benchmark (docs/benchmarks.md): Secret creates on a real
# kube-apiserver + etcd without encryption and with the KMS v2 plugin
# (internal/kmsplugin), side by side in one run, 16 concurrent callers.
# Usage: bench/encryption.sh [benchtime, default 2000x] [count, default 3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$(hack/kube-binaries.sh)}
echo "load before: $(uptime)"
go test -run '^$' -bench 'BenchmarkSecretCreate' -benchtime "${1:-2000x}" -count "${2:-3}" ./internal/kmsplugin/ | grep -E '^(Benchmark|ok|FAIL|---)'
echo "load after: $(uptime)"
