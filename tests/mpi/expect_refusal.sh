#!/bin/sh
# Runs a command that must be REFUSED: exit status 1 (an error, not a signal or a crash) with a
# line containing PATTERN (a fixed string) in its output:
#   expect_refusal.sh PATTERN command [args...]
pattern=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 1 ]; then echo "expect_refusal: status $rc (expected 1)"; exit 1; fi
if ! printf '%s\n' "$out" | grep -qF -- "$pattern"; then echo "expect_refusal: '$pattern' not in the output"; exit 1; fi
echo "expect_refusal: status 1, found '$pattern'"
exit 0
