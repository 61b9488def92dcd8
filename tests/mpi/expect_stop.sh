#!/bin/sh
# A stop signal sent to mpirun mid-run: Open MPI forwards it to every rank, which finish the step,
# agree, save a checkpoint and exit; the run then resumes to its end.
#   expect_stop.sh DIR SIGNAL command [args...]   (the command is mpirun ... train ..., without
#   --save-dir and --resume, which this script adds: DIR/run)
# Exit 0 only when: the stopped run exits non-zero after printing "stopped | SIG<SIGNAL> after step",
# its checkpoint directory holds COMPLETE, and the resumed run exits 0 printing "done |".
dir=$1
sig=$2
shift 2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
out="$dir/stopped.txt"
"$@" --save-dir "$dir/run" > "$out" 2>&1 &
pid=$!
waited=0
until grep -q 'step     3/' "$out"; do  # the third step's line: the ranks are well into the run
  sleep 0.2
  waited=$((waited + 1))
  if [ "$waited" -gt 600 ] || ! kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null
    cat "$out"
    echo "expect_stop: the run never reached step 3"
    exit 1
  fi
done
kill -s "$sig" "$pid"
wait "$pid"
stopped_rc=$?
cat "$out"
if [ "$stopped_rc" -eq 0 ]; then echo "expect_stop: the stopped run exited 0"; exit 1; fi
if ! grep -q "stopped | SIG$sig after step" "$out"; then echo "expect_stop: no stopped line"; exit 1; fi
if ! ls "$dir"/run/step_*/COMPLETE > /dev/null 2>&1; then echo "expect_stop: no complete checkpoint"; exit 1; fi
rest=$("$@" --save-dir "$dir/run" --resume 2>&1)
rc=$?
printf '%s\n' "$rest"
if [ "$rc" -ne 0 ] || ! printf '%s\n' "$rest" | grep -qF "done |"; then echo "expect_stop: the resumed run failed"; exit 1; fi
echo "expect_stop: stopped by SIG$sig (status $stopped_rc), resumed to the end"
exit 0
