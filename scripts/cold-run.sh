#!/bin/sh
# One cold CI run under load, as a loaded CI machine sees it: a fresh clone of main (no
# node_modules), an empty test cache (XDG_CACHE_HOME, which also holds Go's build cache), and a
# CPU-bound process that keeps one core busy for the first LOAD_SECONDS (default 1800) of the run.
#
#   scripts/cold-run.sh /tmp/cold-1        # clone into /tmp/cold-1/src, cache in /tmp/cold-1/cache
#
# It prints the run's passed/failed counts and its duration, and keeps the whole log in
# /tmp/cold-1/run.log. Go's module download cache (GOMODCACHE) is kept: it is not the tests' cache.
# With WARM=1, a warm run follows in the same clone (node_modules and the test cache present, no load), as a
# reused CI machine runs: its counts and duration, and its log in /tmp/cold-1/warm.log.
set -eu
dir=${1:?usage: scripts/cold-run.sh DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$dir"
mkdir -p "$dir/cache"
git clone --quiet "$repo" "$dir/src"
export XDG_CACHE_HOME="$dir/cache"
timeout "${LOAD_SECONDS:-1800}" sh -c 'while :; do :; done' &
load=$!
start=$(date +%s)
status=0
(cd "$dir/src" && ./.ci/run) >"$dir/run.log" 2>&1 || status=$?
end=$(date +%s)
kill "$load" 2>/dev/null || true
printf 'exit %s, %s s, commit %s\n' "$status" $((end - start)) "$(git -C "$dir/src" rev-parse --short HEAD)"
grep -E '^(# |ℹ )(tests|pass|fail|skipped|cancelled|duration_ms)' "$dir/run.log" || true
if [ "${WARM:-}" = 1 ] && [ "$status" = 0 ]; then
  start=$(date +%s)
  (cd "$dir/src" && CI=true npm test) >"$dir/warm.log" 2>&1 || status=$?
  printf 'warm: exit %s, %s s\n' "$status" $(($(date +%s) - start))
  grep -E '^(# |ℹ )(tests|pass|fail|skipped|cancelled|duration_ms)' "$dir/warm.log" || true
fi
exit "$status"
