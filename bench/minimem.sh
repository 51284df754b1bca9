#!/usr/bin/env bash
# Memory of the local cluster (docs/benchmarks.md, "Memory of the local
# cluster"): brings up `mini up` with 3 control planes and 2 workers, waits
# until every node is Ready and lets it settle, then reports the PSS
# (proportional set size, /proc/PID/smaps_rollup: a page shared by N
# processes counts 1/N in each, so the multi-call kube binary and the
# shared libraries are counted once in all) of every process of the
# cluster, per node and per process kind, and each node's pod cgroup
# (memory.current on cgroup v2, memory.usage_in_bytes on v1: the pods'
# anonymous memory and their page cache); then tears the cluster down.
#
# A process belongs to a node if it runs in the node's mount namespace (the
# node agent and its children: containerd, the kubelet, swtpm, the evidence
# server, the containerd shims) or in the node's cgroup root (its pods);
# haproxy and the registry are the host's (the test rig).
#
# Run as root after `make setup build-mini`, with the binaries and images
# cached: the figures are about the cluster, not the builds.
#
# Usage: bench/minimem.sh [settle seconds after all Ready, default 60] [control planes, default 3] [workers, default 2]
# Env:   GATEHOUSE_BENCH_MINI_NETWORK  the cluster's --network (default 4)
#        GATEHOUSE_BENCH_MINI_DIR      its --dir (default /var/lib/gatehouse-mini-mem)
#        GATEHOUSE_BENCH_MINI_KEEP=1   leave the cluster running afterwards
#        GATEHOUSE_BENCH_MINI_RUNNING=1  measure the cluster running in the directory now (no up, no
#                                        settling, no down), e.g. after changing a setting by hand
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
settle=${1:-60}
cps=${2:-3}
workers=${3:-2}
network=${GATEHOUSE_BENCH_MINI_NETWORK:-4}
dir=${GATEHOUSE_BENCH_MINI_DIR:-/var/lib/gatehouse-mini-mem}
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$(hack/kube-binaries.sh)}
export GATEHOUSE_ADDON_BIN=${GATEHOUSE_ADDON_BIN:-$(hack/addon-binaries.sh)}
running=${GATEHOUSE_BENCH_MINI_RUNNING:-0}
keep=${GATEHOUSE_BENCH_MINI_KEEP:-$running}
down() { [[ $keep == 1 ]] || bin/gatehouse mini down --dir "$dir" >/dev/null || true; }
trap down EXIT
kubectl() { "$GATEHOUSE_KUBE_BIN/kubectl" --kubeconfig "$dir/gatehouse-admin.conf" "$@"; }

nodes=()
for ((i = 0; i < cps; i++)); do nodes+=("cp-$i"); done
for ((i = 1; i <= workers; i++)); do nodes+=("worker-$i"); done

if [[ $running != 1 ]]; then
	echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
	start=$SECONDS
	bin/gatehouse mini up --network "$network" --dir "$dir" --control-planes "$cps" --workers "$workers" >"$dir.up.log" 2>&1 ||
		{ tail -20 "$dir.up.log" >&2; exit 1; }
	echo "mini up ($cps control planes, $workers workers): $((SECONDS - start)) s"

	# Every node Ready (mini up returns once they are and CoreDNS is available;
	# checked again here), then settle: the joins' and the first attestations'
	# garbage is collected, the watch caches are filled.
	deadline=$((SECONDS + 300))
	until [[ $(kubectl get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l) -eq ${#nodes[@]} ]]; do
		((SECONDS < deadline)) || { echo "timed out waiting for ${#nodes[@]} Ready nodes" >&2; exit 1; }
		sleep 1
	done
	echo "all ${#nodes[@]} nodes Ready; settling for $settle s"
	sleep "$settle"
fi
# Continuous attestation runs while the figures are taken.
bin/gatehouse verify --all --kubeconfig "$dir/gatehouse-admin.conf" 2>&1 | sed 's/^/  /' || true
echo "load average while measuring: $(cut -d' ' -f1-3 /proc/loadavg)"

# node of each mount namespace and cgroup root, from the cluster's record.
rec="$dir/mini.json"
declare -A ns_node cg_node
while read -r name cg ns; do
	ns_node[$ns]=$name
	cg_node[$cg]=$name
done < <(awk -F'"' '
	$2 == "name" { name = $4 }
	$2 == "cgroupRoot" { cg = $4 }
	$2 == "agentMountNS" { print name, cg, $4 }' "$rec")
host_pids=" $(grep -oE '"(loadBalancerPID|registryPID)": [0-9]+' "$rec" | awk '{print $2}' | tr '\n' ' ') "

# kind PID: the process kind the figures are grouped by.
kind() {
	local argv0 args
	args=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
	argv0=${args%% *}
	argv0=${argv0##*/}
	case $argv0 in
	containerd-shim*) echo containerd-shim ;;
	gatehouse) [[ $args == *node-agent* ]] && echo node-agent || echo "gatehouse-${args#* }" ;;
	gatehouse-bootstrapper) echo bootstrapper-serve-evidence ;;
	gatehouse-joinservice) echo joinservice ;;
	gatehouse-keyservice) echo keyservice ;;
	gatehouse-pause | pause) echo pause ;;
	"") return 1 ;; # a kernel thread
	*) echo "$argv0" ;;
	esac
}

# One line per process: node kind pid pss_kb rss_kb pss_anon_kb pss_file_kb.
samples=$(mktemp)
trap 'rm -f "$samples"; down' EXIT
for p in /proc/[0-9]*; do
	pid=${p#/proc/}
	node=
	if [[ $host_pids == *" $pid "* ]]; then
		node=host
	else
		ns=$(readlink "$p/ns/mnt" 2>/dev/null) || continue
		node=${ns_node[$ns]:-}
		if [[ -z $node ]]; then
			cg=$(awk -F: '$2 == "memory" || ($1 == "0" && $2 == "") { print $3; exit }' "$p/cgroup" 2>/dev/null) || continue
			root=${cg#/}
			root=/${root%%/*}
			node=${cg_node[$root]:-}
		fi
	fi
	[[ -n $node ]] || continue
	k=$(kind "$pid") || continue
	awk -v n="$node" -v k="$k" -v p="$pid" '/^Pss:/ { pss = $2 } /^Rss:/ { rss = $2 } /^Pss_Anon:/ { anon = $2 } /^Pss_File:/ { file = $2 }
		END { if (rss) print n, k, p, pss, rss, anon + 0, file + 0 }' "$p/smaps_rollup" 2>/dev/null
done >"$samples"

echo
echo "PSS by process kind (MiB): anonymous (heap, stacks) and file-backed (binaries, libraries, mapped files)"
echo "parts of it; RSS beside it counts shared pages once per process:"
awk '{ pss[$2] += $4; rss[$2] += $5; anon[$2] += $6; file[$2] += $7; n[$2]++; tp += $4; tr += $5; ta += $6; tf += $7; tn++ }
	END {
		f = "  %-28s x%-3d PSS %7.1f (anon %6.1f, file %6.1f)   RSS %7.1f\n"
		for (k in pss) printf f, k, n[k], pss[k] / 1024, anon[k] / 1024, file[k] / 1024, rss[k] / 1024 | "sort -k4 -nr"
		close("sort -k4 -nr")
		printf f, "total", tn, tp / 1024, ta / 1024, tf / 1024, tr / 1024
	}' "$samples"

echo
echo "PSS by node and process kind (MiB):"
for node in "${nodes[@]}" host; do
	awk -v node="$node" '$1 == node { pss[$2] += $4; n[$2]++; t += $4 }
		END {
			line = ""
			for (k in pss) line = line sprintf(", %s %.0f%s", k, pss[k] / 1024, n[k] > 1 ? " (x" n[k] ")" : "")
			printf "  %-9s %7.1f MiB: %s\n", node, t / 1024, substr(line, 3)
		}' "$samples"
done

echo
echo "pod cgroup of each node (MiB; the pods' memory including their page cache):"
for node in "${nodes[@]}"; do
	cg=$(awk -F'"' -v n="$node" '$2 == "name" { name = $4 } $2 == "cgroupRoot" && name == n { print $4 }' "$rec")
	if [[ -f /sys/fs/cgroup/$cg/memory.current ]]; then
		f=/sys/fs/cgroup/$cg/memory.current
	else
		f=/sys/fs/cgroup/memory/$cg/memory.usage_in_bytes
	fi
	printf "  %-9s %7.1f (%s)\n" "$node" "$(awk '{ print $1 / 1048576 }' "$f")" "$f"
done

echo
# The measuring itself: this shell's and its children's peak.
echo "this script's own RSS: $(awk '/^VmRSS:/ { printf "%.1f MiB", $2 / 1024 }' /proc/$$/status)"
