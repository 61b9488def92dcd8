#!/bin/sh
# A stop signal sent to mpirun mid-run: Open MPI forwards it to every rank, which finish the step,
# agree, save a checkpoint and exit; the run then resumes to its end, on the losses of a run never
# stopped.
#   expect_stop.sh DIR SIGNAL command [args...]   (the command is mpirun ... train ..., without
#   --save-dir, --resume and --log, which this script adds)
# The stopped run holds after step 3 until the signal comes (ULYSSES_TEST_HOLD, engine/stop_signal.h),
# so it lands there however loaded the machine. Exit 0 only when: the stopped run exits non-zero
# after printing "stopped | SIG<SIGNAL> after step 3", step_00000003 holds COMPLETE and every
# rank's rank_R.json, the resumed run exits 0 printing "done |", and its log's step losses are,
# digit for digit, those of the same command run without a stop.
dir=$1
sig=$2
shift 2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "expect_stop: $1"; exit 1; }
. "$(dirname "$0")/wait_for.sh"
# step -> loss, one per line, from a run log's step records
losses() { grep '"type":"step"' "$1" | sed 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/' | sort -n; }

"$@" --log "$dir/whole.jsonl" > "$dir/whole.txt" 2>&1 || { cat "$dir/whole.txt"; fail "the run without a stop failed"; }
out="$dir/stopped.txt"
ULYSSES_TEST_HOLD="step 3" "$@" --save-dir "$dir/run" > "$out" 2>&1 &
pid=$!
wait_for "$pid" "$out" "the run never reached step 3" grep -q 'step     3/' "$out"
kill -s "$sig" "$pid"
wait "$pid"
stopped_rc=$?
cat "$out"
[ "$stopped_rc" -ne 0 ] || fail "the stopped run exited 0"
grep -q "stopped | SIG$sig after step 3 " "$out" || fail "no 'stopped | SIG$sig after step 3' line"
# Every rank got it; rank 0 alone says so, with the way to stop under mpirun (not "Ctrl-C again").
[ "$(grep -c "train: SIG$sig: stopping after this step" "$out")" -eq 1 ] || fail "not one 'train: SIG$sig: stopping' line"
grep -q "to stop under mpirun and save, send it SIGUSR1" "$out" || fail "the signal's line does not say to stop with SIGUSR1"
[ -f "$dir/run/step_00000003/COMPLETE" ] || fail "no complete checkpoint at step 3"
ranks=$(grep -o '^world   | [0-9]* rank' "$out" | grep -o '[0-9]*')
[ -n "$ranks" ] || fail "no 'world' line in the stopped run's output"
r=0
while [ "$r" -lt "$ranks" ]; do
  [ -f "$dir/run/step_00000003/rank_$r.json" ] || fail "no rank_$r.json at step 3"
  r=$((r + 1))
done
rest=$("$@" --save-dir "$dir/run" --resume 2>&1)
rc=$?
printf '%s\n' "$rest"
if [ "$rc" -ne 0 ] || ! printf '%s\n' "$rest" | grep -qF "done |"; then fail "the resumed run failed"; fi
losses "$dir/whole.jsonl" > "$dir/whole.losses"
losses "$dir/run/log.jsonl" > "$dir/resumed.losses"
[ -s "$dir/whole.losses" ] || fail "no step records in the log"
cmp -s "$dir/whole.losses" "$dir/resumed.losses" || { diff "$dir/whole.losses" "$dir/resumed.losses"; fail "the resumed losses differ"; }
echo "expect_stop: stopped by SIG$sig after step 3 (status $stopped_rc) on $ranks ranks, resumed to the end on the same losses"
exit 0
