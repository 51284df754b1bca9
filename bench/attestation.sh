#!/usr/bin/env bash
# Attestation benchmarks, run side by side in one process per package so the
# ratios compare like with like (docs/benchmarks.md records the results):
#   - tpm evidence verification vs. the raw ECDSA P-256 signature check inside it, per way of
#     trusting the AK: pinned, EK-endorsed (EK chain + activation challenge; swtpm, manufactured
#     by a local CA) and Compute Engine (recorded real evidence, AK chain to Google's roots);
#   - confidential VM evidence (sev-snp, tdx: the hardware report from go-sev-guest's test AMD
#     hierarchy or a test Intel hierarchy, plus the vTPM quote) vs. the raw signature checks inside
#     it (vTPM quote, report/quote and QE report signatures, the VCEK or PCK chain);
#   - tpm evidence carrying a real UEFI TCG event log (a UKI's boot under QEMU/OVMF/swtpm, and
#     go-eventlog's recorded Compute Engine log; replayed into the simulator TPM) vs. the raw quote signature check and the same evidence without a log: a log
#     the verifier has not seen ("first") and one it has ("again"; issue 35);
#   - quoting on the simulator TPM (the cost of the test rig itself);
#   - a mutual attested TLS handshake vs. a plain TLS 1.3 handshake with fresh keys.
# Usage: bench/attestation.sh [benchtime, default 3s] [count, default 3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
benchtime=${1:-3s}
count=${2:-3}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench 'BenchmarkVerification|BenchmarkAttest|BenchmarkActivate|BenchmarkHandshake' -benchmem \
	-benchtime "$benchtime" -count "$count" ./internal/attestation/tpm/ ./internal/attestation/cvm/ ./internal/atls/ 2>/dev/null | tee "$out"
echo
awk '
	/^Benchmark/ {
		name=$1; sub(/-[0-9]+$/, "", name); sum[name]+=$3; n[name]++
		for (i = 5; i < NF; i += 2) metric[name "," $(i+1)] += $i
	}
	END {
		for (k in sum) mean[k]=sum[k]/n[k]
		v="BenchmarkVerification/verify-evidence"; r="BenchmarkVerification/raw-signature"
		a="BenchmarkHandshake/atls-mutual-simulator-tpm"; p="BenchmarkHandshake/plain-tls13-fresh-keys"
		printf "tpm verification: %.0f us/op = %.0f verifications/s per core; raw signature %.0f us/op; ratio %.2f (target <= 2)\n", mean[v]/1000, 1e9/mean[v], mean[r]/1000, mean[v]/mean[r]
		split("EK GCE", variants, " ")
		for (i in variants) {
			ve="BenchmarkVerification" variants[i] "/verify-evidence"; re="BenchmarkVerification" variants[i] "/raw-signatures"
			printf "tpm %s verification: %.0f us/op; its raw signature checks %.0f us/op; ratio %.2f (target <= 2)\n", variants[i], mean[ve]/1000, mean[re]/1000, mean[ve]/mean[re]
		}
		split("sev-snp tdx", cvms, " ")
		for (i in cvms) {
			ve="BenchmarkVerification/" cvms[i] "/verify-evidence"; re="BenchmarkVerification/" cvms[i] "/raw-signatures"
			printf "%s verification: %.0f us/op; its raw signature checks %.0f us/op; ratio %.2f (target <= 2)\n", cvms[i], mean[ve]/1000, mean[re]/1000, mean[ve]/mean[re]
		}
		split("ovmf-uki cloud-secure-boot", logs, " ")
		for (i in logs) {
			p="BenchmarkVerificationTCGLog/" logs[i] "/"; r=mean[p "raw-signature"]
			printf "tpm with TCG event log (%s): first %.0f us/op (ratio %.2f), again %.0f us/op (ratio %.2f, target <= 1.5), without log %.0f us/op (ratio %.2f); raw signature %.0f us/op\n", logs[i], mean[p "verify-evidence-first"]/1000, mean[p "verify-evidence-first"]/r, mean[p "verify-evidence-again"]/1000, mean[p "verify-evidence-again"]/r, mean[p "verify-evidence-without-log"]/1000, mean[p "verify-evidence-without-log"]/r, r/1000
			q=p "interleaved"; k=n[q]
			if (k > 0) printf "  interleaved, fastest runs: first/raw %.2f, again/raw %.2f (target <= 1.5), without-log/raw %.2f; raw signature %.0f us\n", metric[q ",first/raw"]/k, metric[q ",again/raw"]/k, metric[q ",without-log/raw"]/k, metric[q ",raw-µs"]/k
		}
		printf "simulator quote (rig cost): %.2f ms/op\n", mean["BenchmarkAttest"]/1e6
		printf "swtpm credential activation (rig cost per EK-endorsed handshake): %.2f ms/op\n", mean["BenchmarkActivate"]/1e6
		printf "mutual aTLS handshake: %.2f ms; plain TLS 1.3: %.2f ms; ratio %.2f\n", mean[a]/1e6, mean[p]/1e6, mean[a]/mean[p]
	}' "$out"
