#!/bin/sh
# Runs a command that must FAIL, and fail promptly: under `timeout 90`, its status must be non-zero
# (it failed) and not 124 (timeout's status: it hung), within 60 seconds.
start=$(date +%s)
timeout 90 "$@"
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "expect_failure: status $rc after ${elapsed} s"
if [ "$rc" -eq 0 ]; then echo "expect_failure: the command succeeded, a failure was expected"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "expect_failure: the command hung (killed by timeout)"; exit 1; fi
if [ "$elapsed" -gt 60 ]; then echo "expect_failure: took ${elapsed} s (limit 60 s)"; exit 1; fi
exit 0
