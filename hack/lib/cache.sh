# A content-keyed build cache for the setup scripts (sourced, not run):
# one directory per key under $GATEHOUSE_CACHE, filled once under a lock,
# complete only with its .complete marker.

# cache_key SRC [EXTRA...]
#   Prints 12 hex digits of SHA-256 over the Go files, go.mod and go.sum
#   under SRC (sorted by path) and EXTRA (e.g. the build flags).
cache_key() {
	local src=$1
	shift
	(
		cd "$src" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs cat
		if (($# > 0)); then echo "$*"; fi
	) | sha256sum | cut -c1-12
}

# cache_enter TAG DIR RESULT
#   When DIR is complete, logs it, prints RESULT and exits the script.
#   Otherwise takes the lock of DIR's parent (another build of it waits),
#   checks again, and makes the empty directory $cache_tmp to build into,
#   removed if the script fails.
cache_enter() {
	local tag=$1 dir=$2 result=$3
	cache_hit "$tag" "$dir" "$result"
	mkdir -p "$(dirname "$dir")"
	exec 9>"$(dirname "$dir")/.lock"
	flock 9
	cache_hit "$tag" "$dir" "$result"
	cache_tmp="$dir.tmp.$$"
	rm -rf "$cache_tmp"
	mkdir -p "$cache_tmp"
	# shellcheck disable=SC2064 # the path is fixed now
	trap "rm -rf '$cache_tmp'" EXIT
}

cache_hit() {
	if [[ -f "$2/.complete" ]]; then
		printf '[%s] cached: %s\n' "$1" "$3" >&2
		echo "$3"
		exit 0
	fi
}

# cache_commit TAG DIR RESULT
#   Marks $cache_tmp complete, moves it to DIR and prints RESULT.
cache_commit() {
	touch "$cache_tmp/.complete"
	rm -rf "$2"
	mv "$cache_tmp" "$2"
	trap - EXIT
	printf '[%s] done: %s\n' "$1" "$3" >&2
	echo "$3"
}
