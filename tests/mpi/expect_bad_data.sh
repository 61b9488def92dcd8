#!/bin/sh
# Token ids past the vocabulary in the training shards, met mid-run by every rank of a dp job:
# the ranks fail together at that step (no MPI_Abort from whichever failed first), each with
# status 1, and rank 0's log ends with an error record carrying the highest failing rank's
# message ("rank 3: ..." on 4 ranks), which rank 0 learned through the step's first collective.
# Then the same in the val shard, met by the eval after the last step.
#   expect_bad_data.sh DIR TRAIN MPIRUN-COMMAND...   (mpirun ... train, without --data/--save-dir)
dir=$1 train=$2
shift 2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
seq 1 2000 > "$dir/a.txt" || exit 1
"$train" prepare --out "$dir/sb" --val-frac 0.2 "$dir/a.txt" > "$dir/prepare.txt" 2>&1 || { cat "$dir/prepare.txt"; exit 1; }
# Token 300 (uint16 little-endian 0x012c), past the header's vocabulary 257, over most of the
# shard: no start-up check reads tokens, the batches do.
i=0
while [ $i -lt 4000 ]; do printf '\054\001'; i=$((i + 1)); done > "$dir/bad_train.bin"
head -c 3000 "$dir/bad_train.bin" > "$dir/bad_val.bin"  # within the val shard's 1779 tokens
cp "$dir/sb/text_train_000000.bin" "$dir/train.bin" && cp "$dir/sb/text_val_000000.bin" "$dir/val.bin" || exit 1
fail=0
for shard in train val; do
  cp "$dir/train.bin" "$dir/sb/text_train_000000.bin" && cp "$dir/val.bin" "$dir/sb/text_val_000000.bin" || exit 1
  dd if="$dir/bad_$shard.bin" of="$dir/sb/text_${shard}_000000.bin" bs=1024 seek=1 conv=notrunc 2> /dev/null || exit 1
  rm -rf "$dir/run"
  timeout 90 "$@" --data "shards:$dir/sb/text_*.bin" --save-dir "$dir/run" > "$dir/out.txt" 2>&1
  rc=$?
  cat "$dir/out.txt"
  echo "expect_bad_data ($shard): status $rc"
  [ "$rc" -eq 1 ] || { echo "expect_bad_data ($shard): status $rc, 1 expected (124: it hung)"; fail=1; }
  grep -q "MPI_ABORT" "$dir/out.txt" && { echo "expect_bad_data ($shard): the job was aborted, not failed together"; fail=1; }
  last=$(tail -n 1 "$dir/run/log.jsonl")
  echo "expect_bad_data ($shard): the log's last record: $last"
  want='"type":"error"' flag='--data: '
  # (a val split's error names it as start-up does)
  [ "$shard" = val ] && want='"type":"error","step":4,"message":"eval: ' flag='--data (its val split): '
  case $last in
    *"$want"*'rank '[1-9]": $flag"*"text_${shard}_000000.bin: token id 300"*) ;;
    *) echo "expect_bad_data ($shard): the log does not end with another rank's error"; fail=1 ;;
  esac
done
exit $fail
