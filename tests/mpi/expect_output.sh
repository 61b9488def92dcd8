#!/bin/sh
# Runs a command that must end with STATUS (0 unless --status says otherwise: 1 for a refusal) and
# print a line containing PATTERN (a fixed string):
#   expect_output.sh [--status N] [--once] PATTERN command [args...]
# --once: the pattern is on exactly one line (a message every rank meets, printed by rank 0 alone).
want=0
once=0
if [ "$1" = "--status" ]; then want=$2; shift 2; fi
if [ "$1" = "--once" ]; then once=1; shift; fi
pattern=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$want" ]; then echo "expect_output: status $rc (expected $want)"; exit 1; fi
if ! printf '%s\n' "$out" | grep -qF -- "$pattern"; then echo "expect_output: '$pattern' not in the output"; exit 1; fi
if [ "$once" = 1 ] && [ "$(printf '%s\n' "$out" | grep -cF -- "$pattern")" -ne 1 ]; then
  echo "expect_output: '$pattern' on more than one line"; exit 1
fi
echo "expect_output: status $rc, found '$pattern'"
exit 0
