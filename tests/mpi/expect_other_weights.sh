#!/bin/sh
# Two "nodes" whose copies of one path differ: mpirun's MPMD form starts rank 0 in DIR/a and rank 1
# in DIR/b, and the same relative --checkpoint (or --save-dir) names another file in each. Every
# flag agrees, so only the weights, compared once loaded, can tell: the job must stop, naming the
# path, on both a --checkpoint start and a --resume. Other --data files under one path are told
# apart by their identity, at start-up.
#   expect_other_weights.sh DIR MPIEXEC TRAIN [mpiexec flags...]
dir=$1 mpiexec=$2 train=$3
shift 3
rm -rf "$dir" && mkdir -p "$dir/a" "$dir/b" || exit 1
tiny="--threads 1 --seq 16 --eval-every 0 --eval-batches 1 --quiet" shape="--dim 32 --heads 2 --layers 1"
# The same model and run, but for the learning rate (which a resume may change): other weights.
(cd "$dir/a" && "$train" $tiny $shape --batch 2 --steps 1 --save-dir run) > "$dir/a.txt" 2>&1 &&
  (cd "$dir/b" && "$train" $tiny $shape --batch 2 --steps 1 --lr 0.01 --save-dir run) > "$dir/b.txt" 2>&1 ||
  { cat "$dir/a.txt" "$dir/b.txt"; echo "expect_other_weights: the single runs failed"; exit 1; }
cp "$dir/a/run/step_00000001/model.bin" "$dir/a/m.bin" && cp "$dir/b/run/step_00000001/model.bin" "$dir/b/m.bin" || exit 1
both() {  # both() OUT args...: the two ranks, one in each directory, the same arguments
  out=$1
  shift
  timeout 90 "$mpiexec" "$@" -np 1 --wdir "$dir/a" "$train" $tiny --comm mpi --batch 1 $ARGS : \
    -np 1 --wdir "$dir/b" "$train" $tiny --comm mpi --batch 1 $ARGS > "$out" 2>&1
}
for case in checkpoint resume; do
  if [ "$case" = checkpoint ]; then ARGS="--steps 1 --checkpoint m.bin" want="after loading --checkpoint m.bin"
  else ARGS="$shape --steps 2 --save-dir run --resume" want="after loading run/step_00000001/model.bin"; fi
  both "$dir/$case.txt" "$@"
  rc=$?
  cat "$dir/$case.txt"
  echo "expect_other_weights: $case: status $rc"
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then echo "expect_other_weights: $case: expected a prompt failure"; exit 1; fi
  if ! grep -q "rank 1 holds other weights than rank 0 $want" "$dir/$case.txt"; then
    echo "expect_other_weights: $case: no message naming the weights' path"; exit 1
  fi
done
# Other text under one relative --data path: refused at start-up by the ranks' check, as --data's
# (not as a checkpoint's files changed since a save: this run has none).
printf 'alpha %04d\n' $(seq 1 300) > "$dir/a/c.txt" && printf 'omega %04d\n' $(seq 1 300) > "$dir/b/c.txt" || exit 1
ARGS="--steps 1 --data text:c.txt"
both "$dir/data.txt" "$@"
rc=$?
cat "$dir/data.txt"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then echo "expect_other_weights: data: expected a prompt failure"; exit 1; fi
if ! grep -q "rank 1 runs with another data_files than rank 0 (--data):" "$dir/data.txt"; then
  echo "expect_other_weights: data: no message naming --data"; exit 1
fi
# A relative --save-dir is another directory for each "node": rank 0 makes its own, rank 1 finds
# none where it would write its rank file. Refused at start-up, before the training it would keep.
ARGS="$shape --steps 2 --save-dir fresh"
both "$dir/save_dir.txt" "$@"
rc=$?
cat "$dir/save_dir.txt"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then echo "expect_other_weights: save-dir: expected a prompt failure"; exit 1; fi
if ! grep -q "rank 1: --save-dir fresh: cannot create a checkpoint there (No such file or directory) where rank 0 could" \
    "$dir/save_dir.txt"; then
  echo "expect_other_weights: save-dir: no message naming --save-dir at start-up"; exit 1
fi
if [ -e "$dir/a/fresh/step_00000002" ]; then echo "expect_other_weights: save-dir: the run trained"; exit 1; fi
# The same bytes in both places: the check passes (it compares weights, not paths).
cp "$dir/a/m.bin" "$dir/b/m.bin" && ARGS="--steps 1 --checkpoint m.bin" && both "$dir/same.txt" "$@" ||
  { cat "$dir/same.txt"; echo "expect_other_weights: the same weights were refused"; exit 1; }
exit 0
