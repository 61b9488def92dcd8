#!/bin/sh
# A rollback under mpirun (rank 0 reads and writes DIR/rollback.json and moves the checkpoints, every
# rank loads): a rollback with a skip that dies in its first save, then a plain --resume, must give
# the step losses of the same rollback never interrupted, digit for digit, and the same command
# again after its run saved must go on, moving nothing.
#   expect_rollback.sh DIR command [args...]   (mpirun ... train ..., without --steps, --save-dir,
#   --resume-step, --skip-batches and --resume, which this script adds)
dir=$1
shift
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "expect_rollback: $1"; exit 1; }
# step loss, one per line, in the log's order
losses() { grep '"type":"step"' "$1" | sed 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/'; }
run() {  # run NAME LOG args...: the command with args, output to DIR/LOG.txt
  name=$1 log=$2
  shift 2
  "$@" > "$dir/$log.txt" 2>&1
}
for name in whole cut; do
  run "$name" "$name-first" "$@" --steps 6 --save-every 2 --save-dir "$dir/$name" ||
    { cat "$dir/$name-first.txt"; fail "the first run of $name failed"; }
done
run whole whole-roll "$@" --steps 6 --save-every 2 --save-dir "$dir/whole" --resume-step 2 --skip-batches 1 ||
  { cat "$dir/whole-roll.txt"; fail "the uninterrupted rollback failed"; }
ULYSSES_TEST_CRASH_IN_SAVE=1 run cut cut-roll "$@" --steps 6 --save-every 2 --save-dir "$dir/cut" --resume-step 2 \
  --skip-batches 1 && { cat "$dir/cut-roll.txt"; fail "the rollback meant to crash in its first save exited 0"; }
run cut cut-resume "$@" --steps 6 --save-every 2 --save-dir "$dir/cut" --resume ||
  { cat "$dir/cut-resume.txt"; fail "the resume after the crash failed"; }
cat "$dir/cut-resume.txt"
grep -q "step 3 trains on sequences from" "$dir/cut-resume.txt" || fail "the resume did not take the rollback's record"
[ -n "$(losses "$dir/whole/log.jsonl")" ] || fail "no step losses in the log"
# The logs read back as one history each: a resume record drops what an earlier attempt wrote after
# it, so the last record of each step, in the log's order, is the one that stands.
last() { losses "$1" | awk '{ l[$1] = $2 } END { for (s in l) print s, l[s] }' | sort -n; }
# And the rollback changed them: its step 3 is not the first run's.
[ "$(losses "$dir/whole/log.jsonl" | awk '$1 == 3' | sort -u | wc -l)" -eq 2 ] || fail "the rollback's step 3 is the first run's"
[ "$(last "$dir/cut/log.jsonl")" = "$(last "$dir/whole/log.jsonl")" ] ||
  { last "$dir/cut/log.jsonl"; last "$dir/whole/log.jsonl"; fail "the losses differ from the rollback never interrupted"; }
run cut cut-again "$@" --steps 8 --save-every 2 --save-dir "$dir/cut" --resume-step 2 --skip-batches 1 ||
  { cat "$dir/cut-again.txt"; fail "the same rollback command again failed"; }
grep -q "was done before" "$dir/cut-again.txt" || { cat "$dir/cut-again.txt"; fail "the repeat did not go on as --resume"; }
[ -d "$dir/cut/step_00000004" ] && [ -d "$dir/cut/step_00000008" ] || fail "the repeat moved checkpoints aside"
exit 0
