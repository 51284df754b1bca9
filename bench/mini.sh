#!/usr/bin/env bash
# Day-two figures of the local cluster (docs/benchmarks.md, "Local cluster"):
# `mini up` wall time, the memory of the running cluster, reboot to Ready
# (a worker and a control plane), and stop/start + recover to all Ready.
# Run as root after `make setup build`; the binaries must be cached, as the
# figures are about the cluster, not the builds.
#
# Usage: bench/mini.sh [control planes, default 3] [workers, default 2]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cps=${1:-3}
workers=${2:-2}
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$(hack/kube-binaries.sh)}
export GATEHOUSE_ADDON_BIN=${GATEHOUSE_ADDON_BIN:-$(hack/addon-binaries.sh)}
dir=$(mktemp -d /tmp/gatehouse-bench-mini.XXXXXX)
trap 'bin/gatehouse mini down --dir "$dir/c" >/dev/null || true; rm -rf "$dir"' EXIT
kubectl() { "$GATEHOUSE_KUBE_BIN/kubectl" --kubeconfig "$dir/c/gatehouse-admin.conf" "$@"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ready_after NODE T: NODE is Ready with a heartbeat after the Unix time T.
ready_after() {
	local hb
	hb=$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
	[[ $hb == True\ * ]] || return 1
	(($(date -d "${hb#True }" +%s) > ${2%.*}))
}

# wait_ready T NODE...: poll (0.5 s) until every NODE is Ready after T, for 5 minutes.
wait_ready() {
	local t=$1 deadline=$((SECONDS + 300)) n
	shift
	while ((SECONDS < deadline)); do
		for n in "$@"; do ready_after "$n" "$t" || continue 2; done
		return 0
	done
	echo "timed out waiting for $* to be Ready" >&2
	return 1
}

nodes=()
for ((i = 0; i < cps; i++)); do nodes+=("cp-$i"); done
for ((i = 1; i <= workers; i++)); do nodes+=("worker-$i"); done

t=$(now)
bin/gatehouse mini up --dir "$dir/c" --control-planes "$cps" --workers "$workers" >"$dir/up.log"
up=$(since "$t")
echo "mini up ($cps control planes, $workers workers) to all Ready, kube-proxy and CoreDNS: ${up} s"
grep -E '^\[' "$dir/up.log" | sed 's/^/  /'

# Memory: RSS of every process in a node's mount namespace or cgroups, and
# of the load balancer and the registry.
sleep 30 # let the control planes settle after the joins
namespaces=$(grep -o '"agentMountNS": "[^"]*"' "$dir/c/mini.json" | cut -d'"' -f4 | tr '\n' ' ')
extra=$(grep -oE '"(loadBalancerPID|registryPID)": [0-9]+' "$dir/c/mini.json" | awk '{print $2}' | tr '\n' ' ')
for p in /proc/[0-9]*; do
	pid=${p#/proc/}
	ns=$(readlink "$p/ns/mnt" 2>/dev/null) || continue
	if [[ " $namespaces " == *" $ns "* ]] || grep -q ':/gh-' "$p/cgroup" 2>/dev/null || [[ " $extra " == *" $pid "* ]]; then
		awk -v c="$(cat "$p/comm" 2>/dev/null)" '/^VmRSS:/ { print c, $2 }' "$p/status" 2>/dev/null
	fi
done | awk '{ kb[$1] += $2; n[$1]++; total += $2; procs++ }
	END {
		printf "memory: %d processes, %.0f MiB RSS in total\n", procs, total / 1024
		for (c in kb) printf "  %-28s x%-3d %6.0f MiB\n", c, n[c], kb[c] / 1024 | "sort -k3 -nr"
	}'

for n in worker-1 cp-1; do
	[[ " ${nodes[*]} " == *" $n "* ]] || continue
	t=$(now)
	bin/gatehouse mini node reboot --dir "$dir/c" "$n" >/dev/null
	wait_ready "$t" "$n"
	echo "reboot $n to Ready (heartbeat after the reboot): $(since "$t") s"
done

bin/gatehouse mini stop --dir "$dir/c" >/dev/null
t=$(now)
recover=$(bin/gatehouse mini start --dir "$dir/c" | grep 'gatehouse recover' | sed 's/^ *gatehouse //')
# shellcheck disable=SC2086 # the printed command's words
bin/gatehouse $recover >/dev/null
echo "mini start to recover done: $(since "$t") s"
wait_ready "$t" "${nodes[@]}"
echo "mini start + recover to all ${#nodes[@]} nodes Ready (heartbeats after the start): $(since "$t") s"
