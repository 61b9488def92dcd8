#!/bin/sh
# A stop signal that reaches one MPI process only (rank 1), during an eval: every rank leaves the
# eval before the same micro-batch (the signal rides the eval's per-batch all-reduce), rank 0 names
# the signal it never caught itself, the checkpoint is saved with every rank's file, and --resume
# runs the cut eval again: the val losses of a run never stopped.
#   expect_eval_cut.sh DIR TRAIN mpirun [args...]   (the launcher, e.g. mpirun -np 4 ...)
# Rank 1 alone holds before the eval's batch 2 (ULYSSES_TEST_HOLD, engine/stop_signal.h) until its
# signal comes, so the others wait for it in that batch's all-reduce.
dir=$1
train=$2
shift 2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "expect_eval_cut: $1"; exit 1; }
. "$(dirname "$0")/wait_for.sh"
# step -> val loss, one per line, from a run log's eval records
val_losses() { grep '"type":"eval"' "$1" | sed 's/.*"step":\([0-9]*\),"val_loss":\([^,]*\),.*/\1 \2/' | sort -n; }
args="--comm mpi --sp 2 --threads 1 --seq 128 --batch 2 --steps 4 --eval-every 2 --eval-batches 3"

# Open MPI names each process's rank in OMPI_COMM_WORLD_RANK, MPICH's Hydra in PMI_RANK; rank 1
# writes its pid and holds.
cat > "$dir/rank.sh" <<EOF
if [ "\${OMPI_COMM_WORLD_RANK:-\$PMI_RANK}" = 1 ]; then
  echo \$\$ > "$dir/rank1.pid"
  export ULYSSES_TEST_HOLD="eval batch 2"
fi
exec "$train" "\$@"
EOF

"$@" "$train" $args --log "$dir/whole.jsonl" > "$dir/whole.txt" 2>&1 || { cat "$dir/whole.txt"; fail "the run without a stop failed"; }
out="$dir/stopped.txt"
"$@" sh "$dir/rank.sh" $args --save-dir "$dir/run" > "$out" 2>&1 &
pid=$!
held() { [ -s "$dir/rank1.pid" ] && grep -q 'test hold | eval batch 2' "$out"; }
wait_for "$pid" "$out" "rank 1 never held at the eval's batch 2" held
kill -s TERM "$(cat "$dir/rank1.pid")"
wait "$pid"
stopped_rc=$?
cat "$out"
[ "$stopped_rc" -ne 0 ] || fail "the stopped run exited 0"
grep -q "eval      2 | cut short by SIGTERM before batch 2 of 3 | not logged" "$out" ||
  fail "no 'eval      2 | cut short by SIGTERM before batch 2 of 3' line"
grep -q "stopped | SIGTERM after step 2 of 4 " "$out" || fail "no 'stopped | SIGTERM after step 2 of 4' line"
[ -f "$dir/run/step_00000002/COMPLETE" ] || fail "no complete checkpoint at step 2"
for r in 0 1 2 3; do
  [ -f "$dir/run/step_00000002/rank_$r.json" ] || fail "no rank_$r.json at step 2"
done
if grep -q '"type":"eval"' "$dir/run/log.jsonl"; then fail "the cut eval was logged"; fi
rest=$("$@" "$train" $args --save-dir "$dir/run" --resume 2>&1)
rc=$?
printf '%s\n' "$rest"
if [ "$rc" -ne 0 ] || ! printf '%s\n' "$rest" | grep -qF "done |"; then fail "the resumed run failed"; fi
val_losses "$dir/whole.jsonl" > "$dir/whole.val"
val_losses "$dir/run/log.jsonl" > "$dir/resumed.val"
[ "$(wc -l < "$dir/whole.val")" -eq 2 ] || fail "the run without a stop has not 2 evals"
cmp -s "$dir/whole.val" "$dir/resumed.val" || { diff "$dir/whole.val" "$dir/resumed.val"; fail "the val losses differ"; }
echo "expect_eval_cut: rank 1 alone signalled, every rank left eval 2 before batch 2, resumed on the same val losses"
exit 0
