#!/bin/sh
# Runs a command that must SUCCEED and print a line containing PATTERN (a fixed string):
#   expect_output.sh PATTERN command [args...]
# Exit 0 only when the command's status is 0 and PATTERN is in its output (stdout + stderr).
pattern=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then echo "expect_output: status $rc (expected 0)"; exit 1; fi
if ! printf '%s\n' "$out" | grep -qF -- "$pattern"; then echo "expect_output: '$pattern' not in the output"; exit 1; fi
echo "expect_output: status 0, found '$pattern'"
exit 0
