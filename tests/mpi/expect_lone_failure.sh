#!/bin/sh
# One rank fails alone (its rank_1.json is gone, which only rank 1 reads on a resume at the same
# layout): the ranks agree on the load's outcome (engine/resume.cpp), so the job ends promptly,
# non-zero, with one line from rank 0 naming rank 1 and the file, instead of hanging in the
# collective after the load or aborting. (A failure no agreement covers is said by its rank and
# ends the job by MPI_Abort: mpi_train_lone_start_failure_emu.)
#   expect_lone_failure.sh DIR command [args...]   (mpirun ... train ..., without --steps,
#   --save-dir and --resume, which this script adds)
dir=$1
shift
rm -rf "$dir" && mkdir -p "$dir" || exit 1
"$@" --steps 2 --save-dir "$dir/run" > "$dir/saved.txt" 2>&1 || { cat "$dir/saved.txt"; echo "expect_lone_failure: the first run failed"; exit 1; }
rm "$dir/run/step_00000002/rank_1.json" || exit 1
start=$(date +%s)
timeout 90 "$@" --steps 4 --save-dir "$dir/run" --resume > "$dir/failed.txt" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$dir/failed.txt"
echo "expect_lone_failure: status $rc after ${elapsed} s"
if [ "$rc" -eq 0 ]; then echo "expect_lone_failure: the resume succeeded, a failure was expected"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "expect_lone_failure: the job hung (killed by timeout)"; exit 1; fi
if ! grep -q "train: error: rank 1: .*rank_1.json" "$dir/failed.txt"; then echo "expect_lone_failure: no message naming rank 1 and rank_1.json"; exit 1; fi
if [ "$(grep -c "train: error:" "$dir/failed.txt")" -ne 1 ]; then echo "expect_lone_failure: the error is not said exactly once"; exit 1; fi
# The others' SIGTERM from mpirun (when it comes before its SIGKILL) is not taken for the cause.
if grep "train: SIGTERM: stopping" "$dir/failed.txt" | grep -vq "when another process failed: then that process's error says why"; then
  echo "expect_lone_failure: a SIGTERM line without the note that it may be the job ending after another failed"; exit 1
fi
exit 0
