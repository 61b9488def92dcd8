#!/bin/sh
# Runs a command that must FAIL, and fail promptly: under `timeout 90`, its status must be non-zero
# (it failed) and not 124 (timeout's status: it hung), within 60 seconds.
#   expect_failure.sh [--want TEXT]... [--any TEXT]... [--not TEXT]... CMD...
# --want: TEXT must be in its output (it failed the way the test means, not at start-up);
# --any: at least one of the --any TEXTs must be (two ways a launcher may end the same failure);
# --not: TEXT must not be.
want="" any="" not=""
while [ $# -gt 0 ]; do
  case $1 in
    --want) want="$want
$2"; shift 2 ;;
    --any) any="$any
$2"; shift 2 ;;
    --not) not="$not
$2"; shift 2 ;;
    *) break ;;
  esac
done
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout 90 "$@" > "$out" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$out"
echo "expect_failure: status $rc after ${elapsed} s"
if [ "$rc" -eq 0 ]; then echo "expect_failure: the command succeeded, a failure was expected"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "expect_failure: the command hung (killed by timeout)"; exit 1; fi
if [ "$elapsed" -gt 60 ]; then echo "expect_failure: took ${elapsed} s (limit 60 s)"; exit 1; fi
fail=0
printf '%s\n' "$want" | while IFS= read -r w; do
  [ -z "$w" ] && continue
  grep -qF -- "$w" "$out" || { echo "expect_failure: no '$w' in the output"; exit 1; }
done || fail=1
if [ -n "$any" ]; then
  found=$(printf '%s\n' "$any" | while IFS= read -r w; do
    [ -n "$w" ] && grep -qF -- "$w" "$out" && echo yes
  done)
  [ -n "$found" ] || { echo "expect_failure: none of these in the output:$any"; fail=1; }
fi
printf '%s\n' "$not" | while IFS= read -r w; do
  [ -z "$w" ] && continue
  ! grep -qF -- "$w" "$out" || { echo "expect_failure: '$w' in the output"; exit 1; }
done || fail=1
exit "$fail"
