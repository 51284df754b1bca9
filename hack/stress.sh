#!/usr/bin/env bash
# Flake hunt (docs/development.md, "Flakes"): run the tests of each package
# COUNT times in fresh processes, with and without the race detector, and
# report every failing run with its output.
# Usage: hack/stress.sh [COUNT, default 20] [PACKAGE...] (default: every
# package with tests). RUN=<regexp> limits the tests; OUT=<dir> keeps the
# failing runs' output (default: a new temporary directory).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GATEHOUSE_KUBE_BIN=${GATEHOUSE_KUBE_BIN:-$(hack/kube-binaries.sh)}
export GATEHOUSE_ADDON_BIN=${GATEHOUSE_ADDON_BIN:-$(hack/addon-binaries.sh)}
count=${1:-20}
shift || true
if [[ $# -gt 0 ]]; then
  pkgs=("$@")
else
  mapfile -t pkgs < <(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./... | grep -v /test/e2e)
fi
out=${OUT:-$(mktemp -d /tmp/gatehouse-stress.XXXXXX)}
mkdir -p "$out"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
summary=()
failed=0
for pkg in "${pkgs[@]}"; do
  name=${pkg//\//_}
  for mode in race norace; do
    flags=()
    [[ $mode == race ]] && flags=(-race)
    if ! go test -c "${flags[@]}" -o "$bin/$name.$mode.test" "$pkg" >"$out/$name.$mode.build.log" 2>&1; then
      echo "$pkg ($mode): does not build, see $out/$name.$mode.build.log" >&2
      failed=1
      continue
    fi
    [[ -x $bin/$name.$mode.test ]] || continue # no tests
    dir=$(go list -f '{{.Dir}}' "$pkg")
    fails=0
    started=$SECONDS
    for ((i = 1; i <= count; i++)); do
      log="$out/$name.$mode.$i.log"
      if (cd "$dir" && "$bin/$name.$mode.test" -test.count=1 -test.timeout=20m ${RUN:+-test.run "$RUN"}) >"$log" 2>&1; then
        rm -f "$log"
      else
        fails=$((fails + 1))
        echo "FAIL $pkg ($mode) run $i of $count: $log" >&2
        grep -E '^\s*(--- FAIL|panic:|\S+_test\.go:[0-9]+:)' "$log" | head -5 >&2 || true
      fi
    done
    summary+=("$(printf '%-60s %-6s %d/%d failed  %ds' "$pkg" "$mode" "$fails" "$count" $((SECONDS - started)))")
    echo "${summary[-1]}" >&2 # as it goes: a whole run takes hours
    [[ $fails -gt 0 ]] && failed=1
  done
done
printf '%s\n' "${summary[@]}"
echo "failing runs' output: $out"
exit $failed
