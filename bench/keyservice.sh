#!/usr/bin/env bash
# Key service benchmarks, side by side in one process (docs/benchmarks.md):
# GetDataKey over gRPC + mutual TLS on loopback vs. a no-op RPC on the same
# server and connection, for 1 and 64 concurrent callers, and in-process HKDF.
# Usage: bench/keyservice.sh [benchtime, default 3s] [count, default 5]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench 'BenchmarkKeyService' -benchtime "${1:-3s}" -count "${2:-5}" ./keyservice/ | tee "$out"
echo
# Medians over the runs: this shared 2-core VM has outlier runs.
awk '
	/^Benchmark/ { name=$1; sub(/-[0-9]+$/, "", name); v[name, ++n[name]]=$3 }
	END {
		for (k in n) {
			m=n[k]
			for (i=1; i<=m; i++) a[i]=v[k, i]
			for (i=1; i<=m; i++) for (j=i+1; j<=m; j++) if (a[j] < a[i]) { t=a[i]; a[i]=a[j]; a[j]=t }
			mean[k] = (m % 2) ? a[(m+1)/2] : (a[m/2] + a[m/2+1]) / 2
		}
		for (c = 1; c <= 64; c *= 64) {
			g="BenchmarkKeyService/GetDataKey/callers=" c; o="BenchmarkKeyService/noop-rpc/callers=" c
			printf "callers=%d: GetDataKey %.0f/s, no-op RPC %.0f/s, ratio %.2f (target >= 0.8)\n", c, 1e9/mean[g], 1e9/mean[o], mean[o]/mean[g]
		}
		h="BenchmarkKeyService/in-process-hkdf"
		printf "in-process HKDF %.0f/s; GetDataKey (64 callers) / in-process = %.3f\n", 1e9/mean[h], mean[h]/mean["BenchmarkKeyService/GetDataKey/callers=64"]
	}' "$out"
