#!/bin/sh
# A checkpoint saved by 4 MPI processes, resumed by 4 local ranks: the same spread of sequences,
# but the ranks' gradients added in another order (MPI's algorithm against rank order), so the
# resume says it is not bit-exact, naming the backend it was saved on; the same backend again
# says nothing.
#   expect_comm_change.sh DIR TRAIN mpirun [args...]   (the launcher, e.g. mpirun -np 4 ...)
dir=$1
train=$2
shift 2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "expect_comm_change: $1"; exit 1; }
args="--threads 1 --seq 16 --batch 2 --dim 32 --heads 2 --layers 1 --eval-every 0 --eval-batches 1 --save-dir $dir/run"
timeout 90 "$@" "$train" $args --comm mpi --steps 2 > "$dir/saved.txt" 2>&1 || { cat "$dir/saved.txt"; fail "the MPI run failed"; }
same=$(timeout 90 "$@" "$train" $args --comm mpi --steps 3 --resume 2>&1) || { printf '%s\n' "$same"; fail "the MPI resume failed"; }
printf '%s\n' "$same"
if printf '%s\n' "$same" | grep -q "another layout"; then fail "a resume on the same backend said 'another layout'"; fi
local=$(timeout 90 "$train" $args --comm local --ranks 4 --steps 4 --resume 2>&1) || { printf '%s\n' "$local"; fail "the local resume failed"; }
printf '%s\n' "$local"
printf '%s\n' "$local" | grep -qF "another layout: saved at dp 4 x sp 1, batch 2, grad-accum 1, --comm mpi; now dp 4 x sp 1, batch 2, grad-accum 1: the same 8 sequences a step, summed in another order (not bit-exact)" ||
  fail "the local resume of the MPI run did not say it is not bit-exact"
echo "expect_comm_change: the local resume of an MPI checkpoint said so; an MPI resume said nothing"
exit 0
