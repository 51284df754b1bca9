#!/usr/bin/env bash
# Runs every go test -fuzz target in the module for a short time each
# (FUZZTIME, default 5s). Their seed corpora also run as plain tests in
# `make unit`; this adds coverage-guided mutation on top. A failure leaves the
# crashing input under the package's testdata/fuzz/, to be committed as a
# regression test once fixed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzztime=${FUZZTIME:-5s}
mapfile -t targets < <(git grep -E '^func Fuzz[A-Za-z0-9_]+' -- '*_test.go' |
	sed -E 's#^(.*)/[^/]+_test.go:func (Fuzz[A-Za-z0-9_]+).*#\1 \2#' | sort -u)
if ((${#targets[@]} == 0)); then
	echo "[fuzz] no fuzz targets found" >&2
	exit 1
fi
for t in "${targets[@]}"; do
	dir=${t% *}
	name=${t#* }
	echo "[fuzz] $dir $name for $fuzztime" >&2
	go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "./$dir"
done
echo "[fuzz] ${#targets[@]} targets fuzzed" >&2
