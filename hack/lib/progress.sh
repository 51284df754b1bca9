# Progress for the setup scripts' long steps (sourced, not run): a user
# never watches a silent terminal for more than PROGRESS_INTERVAL seconds.

# progress_run TAG WHAT TOTAL COMMAND...
#   Runs COMMAND; while it runs, prints "[TAG] WHAT: 1m30s" every
#   PROGRESS_INTERVAL (default 15) seconds, and when it ends after 5 s or
#   more "[TAG] WHAT: done in 2m05s". COMMAND's standard output passes through; its standard
#   error is kept and shown only when it fails. TOTAL > 0 says COMMAND is
#   a `go build -v` or `go install -v` whose standard error names each
#   package as it is compiled: the lines then also say how many of about
#   TOTAL packages are compiled (TOTAL -1: how many, with no total).
progress_run() {
	local tag=$1 what=$2 total=$3
	shift 3
	local interval=${PROGRESS_INTERVAL:-15}
	local errlog
	errlog=$(mktemp)
	local start=$SECONDS next=$((SECONDS + interval))
	"$@" 2>"$errlog" &
	local pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1
		if ((SECONDS >= next)) && kill -0 "$pid" 2>/dev/null; then
			printf '[%s] %s: %s%s\n' "$tag" "$what" "$(progress_elapsed $((SECONDS - start)))" "$(progress_packages "$errlog" "$total")" >&2
			next=$((next + interval))
		fi
	done
	local rc=0
	wait "$pid" || rc=$?
	if ((rc != 0)); then
		printf '[%s] %s failed after %s:\n' "$tag" "$what" "$(progress_elapsed $((SECONDS - start)))" >&2
		# A go build -v's package lines say nothing about the failure.
		if ((total != 0)); then grep -vE '^[[:alnum:]._~/-]+$' "$errlog" >&2 || true; else cat "$errlog" >&2; fi
		rm -f "$errlog"
		return "$rc"
	fi
	if ((SECONDS - start >= 5)); then
		printf '[%s] %s: done in %s%s\n' "$tag" "$what" "$(progress_elapsed $((SECONDS - start)))" "$(progress_packages "$errlog" "$total" done)" >&2
	fi
	rm -f "$errlog"
}

# progress_elapsed SECONDS prints them as 1m05s (or 42s).
progress_elapsed() {
	if (($1 >= 60)); then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi
}

# progress_packages ERRLOG TOTAL [done] prints ", N of about TOTAL packages
# compiled" for a go build -v whose standard error is ERRLOG.
progress_packages() {
	(($2 != 0)) || return 0
	local n
	n=$(grep -cE '^[[:alnum:]._~/-]+$' "$1" || true)
	if (($2 > 0)) && [[ -z ${3:-} ]]; then
		printf ', %d of about %d packages compiled' "$n" "$2"
	elif ((n == 1)); then
		printf ', 1 package compiled'
	else
		printf ', %d packages compiled' "$n"
	fi
}
