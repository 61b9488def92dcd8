#!/usr/bin/env bash
# The GPU check: one command for a machine with one NVIDIA GPU (CUDA 13, cuBLAS, PyTorch; no MPI,
# no apt — Eigen and Catch2 come from .carry/, made by bench/carry_deps.sh). Within ~8 minutes:
#   1. build with real CUDA (sm_90);
#   2. the tests labelled gpu (every kernel against the CPU op on the device, cuBLASLt, mma,
#      a training step against the CPU);
#   3. SP on one GPU: the local communicator with 2 ranks against 1 rank;
#   4. GPT-2 124M (bf16, T = 1024) tokens/s and MFU (and one profiled step: the longest ops); the
#      memory-bound kernels' GB/s against a device-to-device copy, and the classifier's GEMMs by
#      chunk size; --offload's step time and device activations against --recompute alone at
#      T = 16K; attention forward + backward TFLOP/s against PyTorch's
#      scaled_dot_product_attention (default and by backend) at T = 4K, 16K, 64K, head dims 64
#      and 128, causal; packed documents and a sliding window against causal only;
#   5. with time to spare, the bf16 attention kernels' test under compute-sanitizer memcheck;
# and prints one short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
# Every log goes to gpu_check_out/ (ignored by git). GPU_CHECK_ARCHIVE=DIR also leaves, whatever
# happens, two files in DIR: the table and all logs as one archive (for a runner that brings back
# only a few files).
LOGS=gpu_check_out
rm -rf "$LOGS" && mkdir -p "$LOGS"
archive() {
  [ -n "${GPU_CHECK_ARCHIVE:-}" ] || return 0
  mkdir -p "$GPU_CHECK_ARCHIVE" && cp "$LOGS/table.txt" "$GPU_CHECK_ARCHIVE/" &&
    tar czf "$GPU_CHECK_ARCHIVE/gpu_check_logs.tgz" -C "$LOGS" .
}
trap archive EXIT
export PATH="$PATH:/usr/local/cuda/bin"
row() { printf '%-44s %s\n' "$1" "$2" >> "$LOGS/table.txt"; }
: > "$LOGS/table.txt"

echo "== build (${SECONDS} s)"
# Only what this script runs (not the cpu tests): under a minute on 16 cores. If nvcc refuses the
# machine's g++ as too new (a bare image may pair them so), the build is retried once telling it
# to accept it, and the table says so.
build() {
  cmake -S . -B build-gpu -DULYSSES_CUDA=ON -DULYSSES_WITH_MPI=OFF -DCMAKE_PREFIX_PATH="$PWD/.carry" "$@" \
    > "$LOGS/configure.log" 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" --target train tests_gpu bench_gpt2_step bench_attention bench_kernels \
      > "$LOGS/build.log" 2>&1
}
if build; then
  row "build (nvcc, sm_90)" "ok"
elif cat "$LOGS/configure.log" "$LOGS/build.log" 2>/dev/null | grep -q "unsupported GNU version" && rm -rf build-gpu &&
     build -DCMAKE_CUDA_FLAGS=-allow-unsupported-compiler; then
  row "build (nvcc, sm_90)" "ok, with -allow-unsupported-compiler (g++ $(c++ -dumpversion))"
else
  row "build (nvcc, sm_90)" "FAILED (see $LOGS/configure.log, $LOGS/build.log)"
  for f in "$LOGS/configure.log" "$LOGS/build.log"; do [ -f "$f" ] && tail -n 30 "$f"; done
  cat "$LOGS/table.txt"; exit 1
fi

echo "== tests labelled gpu (${SECONDS} s)"
(cd build-gpu && timeout 240 ctest -L gpu --output-on-failure -j 4) > "$LOGS/ctest_gpu.log" 2>&1
row "ctest -L gpu" "$(grep -E 'tests passed|tests failed' "$LOGS/ctest_gpu.log" | tail -1)"
# ctest lists the failures after "The following tests FAILED:", one "  N - name (Failed)" a line.
sed -n '/The following tests FAILED/,$p' "$LOGS/ctest_gpu.log" | grep -E '^[[:space:]]+[0-9]+ - ' | head -8 |
  while read -r line; do row "  failed" "$line"; done

echo "== SP on one GPU (local communicator) (${SECONDS} s)"
common="--device cuda --precision fp32 --steps 5 --seq 256 --batch 2 --eval-every 0 --eval-batches 1"
timeout 60 ./build-gpu/train $common --ranks 1 > "$LOGS/sp1.log" 2>&1
timeout 60 ./build-gpu/train $common --ranks 2 --sp 2 > "$LOGS/sp2.log" 2>&1
l1=$(grep -o 'train loss [0-9.]* -> [0-9.]*' "$LOGS/sp1.log"); l2=$(grep -o 'train loss [0-9.]* -> [0-9.]*' "$LOGS/sp2.log")
row "sp 2 vs sp 1 losses (fp32)" "${l2:-failed} | ${l1:-failed}"

echo "== GPT-2 124M, bf16, T = 1024 (${SECONDS} s)"
for b in 8 32; do  # llm.c's H100 figures use larger batches; the small one shows launch overheads
  # --profile: one more step with each op's GPU time (B = 32's longest in the table, all in the logs)
  timeout 120 ./build-gpu/bench_gpt2_step --device cuda --precision bf16 --batch $b --seq 1024 --steps 10 \
    --profile > "$LOGS/gpt2_b$b.log" 2>&1
  tps=$(grep -o 'tokens/s [0-9.]*' "$LOGS/gpt2_b$b.log" | tail -1); mfu=$(grep -o 'MFU [0-9.]*%' "$LOGS/gpt2_b$b.log" | tail -1)
  row "GPT-2 124M bf16 T=1024 B=$b tokens/s, MFU" "${tps:-no result (see $LOGS/gpt2_b$b.log)}${mfu:+, $mfu}"
done
# The longest ops of the B = 32 profiled step (bench_gpt2_step --profile: "ms % calls TFLOP/s op").
sed -n '/^profile:/,$p' "$LOGS/gpt2_b32.log" | awk 'NR > 2 && NR <= 10' | while read -r ms pct calls rate op; do
  row "  B=32 op: $op" "$ms ms, $pct%, $calls calls, TFLOP/s $rate"
done

echo "== memory-bound kernels against a device-to-device copy (GPT-2 124M shapes) (${SECONDS} s)"
timeout 60 ./build-gpu/bench_kernels > "$LOGS/kernels.log" 2>&1
# Lines "name ... X GB/s R" after the header; the three with the lowest ratio to the copy.
copy=$(grep -o 'cudaMemcpy device to device .* GB/s' "$LOGS/kernels.log" | grep -o '[0-9.]* GB/s')
worst=$(awk '/^kernel/ {on = 1; next} on && / GB\/s / {r = $NF; $NF = ""; sub(/ +[0-9.]+ MB .*/, ""); print r, $0}' \
  "$LOGS/kernels.log" | sort -n | head -3 | awk '{r = $1; $1 = ""; sub(/^ +/, ""); printf "%s%s %s", (NR > 1 ? ", " : ""), $0, r}')
row "kernels vs copy (${copy:-no result}): lowest" "${worst:-n/a (see $LOGS/kernels.log)}"
# Then "rows logits dx dw" TFLOP/s of the classifier's GEMMs at 1, 2, 4 x the chunk's rows.
gemms=$(awk '/^chunk rows/ {on = 1; next} on && NF == 4 {printf "%s%s: %s/%s/%s", (n++ ? "; " : ""), $1, $2, $3, $4}' \
  "$LOGS/kernels.log")
row "classifier GEMMs logits/dx/dw TFLOP/s by rows" "${gemms:-n/a (see $LOGS/kernels.log)}"

echo "== --offload against --recompute alone (gpt2-124M, bf16, T = 16384) (${SECONDS} s)"
lc="--device cuda --model gpt2-124M --batch 1 --seq 16384 --steps 4 --eval-every 0 --eval-batches 1 --recompute --mlp-chunks 4"
timeout 90 ./build-gpu/train $lc > "$LOGS/recompute.log" 2>&1
timeout 90 ./build-gpu/train $lc --offload > "$LOGS/offload.log" 2>&1
step_ms() { grep -o '| [0-9.]* ms |' "$1" | tail -1 | grep -o '[0-9.]*'; }
act_mib() { grep -o 'act [0-9.]* MiB' "$1" | tail -1 | grep -o '[0-9.]*'; }
ms_act() { local ms act; ms=$(step_ms "$1"); act=$(act_mib "$1"); [ -n "$ms" ] && echo "$ms ms, $act MiB" || echo "no result"; }
row "step ms, act MiB: recompute | + offload" "$(ms_act "$LOGS/recompute.log") | $(ms_act "$LOGS/offload.log")"

echo "== attention vs PyTorch SDPA (${SECONDS} s)"
timeout 150 ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 --seqs 4096,16384,65536 \
  --dims 64,128 > "$LOGS/attn_ours.log" 2>&1
timeout 150 python3 bench/sdpa_reference.py --seqs 4096,16384,65536 --dims 64,128 --heads 16 \
  > "$LOGS/attn_sdpa.log" 2>&1
# sdpa_reference.py prints "T D fwd_ms fwd_bwd_ms TFLOP/s backend", backend default, flash, cudnn, ...
sdpa() { awk -v T="$1" -v D="$2" -v B="$3" '$1 == T && $2 == D && $6 == B {print $5}' "$LOGS/attn_sdpa.log"; }
while read -r dev dt T D f fb tf doc rows; do
  [ "$dev" = cuda ] || continue
  ref=$(sdpa "$T" "$D" default)
  ratio=$(awk -v a="$tf" -v b="${ref:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
  row "attention T=$T D=$D TFLOP/s (ours | SDPA)" \
    "$tf | ${ref:-n/a} | ratio $ratio | flash $(sdpa "$T" "$D" flash) cudnn $(sdpa "$T" "$D" cudnn)"
done < "$LOGS/attn_ours.log"
grep -q '^cuda ' "$LOGS/attn_ours.log" || row "attention vs SDPA" "no result (see $LOGS/attn_ours.log)"

echo "== attention with 128 query rows a block (forward and dq pass) against 64 (${SECONDS} s)"
# The same kernels with twice the rows per block: each K/V tile fetched serves twice the rows (see
# RESULTS.md, FLOPs per byte), at fewer blocks per SM. The faster one should be the default.
timeout 90 ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 --seqs 16384,65536 --dims 64,128 \
  --query-rows 128 > "$LOGS/attn_rows128.log" 2>&1
while read -r dev dt T D f fb tf doc rows; do
  [ "$dev" = cuda ] || continue
  base=$(awk -v T="$T" -v D="$D" '$1 == "cuda" && $3 == T && $4 == D {print $5 " " $6}' "$LOGS/attn_ours.log")
  row "attention T=$T D=$D fwd | fwd+bwd ms, 64 rows -> 128 rows" "${base:-n/a} -> $f $fb"
done < "$LOGS/attn_rows128.log"
grep -q '^cuda ' "$LOGS/attn_rows128.log" || row "attention, 128 query rows" "no result (see $LOGS/attn_rows128.log)"

echo "== attention with packed 2K-token documents (tiles that share none are skipped) (${SECONDS} s)"
timeout 60 ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 --seqs 16384 --dims 64 \
  --doc-len 2048 > "$LOGS/attn_docs.log" 2>&1
causal_ms=$(awk '$1 == "cuda" && $3 == 16384 && $4 == 64 {print $6}' "$LOGS/attn_ours.log")
docs_ms=$(awk '$1 == "cuda" && $3 == 16384 && $4 == 64 {print $6}' "$LOGS/attn_docs.log")
row "attention T=16K D=64 fwd+bwd ms: causal | 2K docs" "${causal_ms:-n/a} | ${docs_ms:-n/a}"

echo "== attention with a 4K-token sliding window at T = 64K (tiles older than the window skipped) (${SECONDS} s)"
timeout 60 ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 --seqs 65536 --dims 64 \
  --window 4096 > "$LOGS/attn_window.log" 2>&1
causal_ms=$(awk '$1 == "cuda" && $3 == 65536 && $4 == 64 {print $6}' "$LOGS/attn_ours.log")
window_ms=$(awk '$1 == "cuda" && $3 == 65536 && $4 == 64 {print $6}' "$LOGS/attn_window.log")
row "attention T=64K D=64 fwd+bwd ms: causal | 4K window" "${causal_ms:-n/a} | ${window_ms:-n/a}"

# With time to spare (the whole check stays within ~8 minutes): the tensor-core attention kernels
# under compute-sanitizer's memcheck, for out-of-bounds and misaligned accesses that the tests'
# comparisons might not show. Some machines' runtimes do not support it; the row then says so.
left=$((470 - SECONDS))
if [ "$left" -ge 60 ] && command -v compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer memcheck: the bf16 attention kernels (${SECONDS} s)"
  timeout "$((left < 150 ? left : 150))" compute-sanitizer --tool memcheck --error-exitcode 9 \
    ./build-gpu/tests/test_attention_gpu "attention CUDA kernels match the CPU backend (bf16*" \
    > "$LOGS/memcheck.log" 2>&1
  rc=$?
  row "memcheck, bf16 attention kernels (exit $rc)" \
    "$(grep -o 'ERROR SUMMARY: [0-9]* errors*' "$LOGS/memcheck.log" | tail -1 || true)"
else
  row "memcheck, bf16 attention kernels" "skipped (${left} s left, or no compute-sanitizer)"
fi

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F), ${SECONDS} s)"
cat "$LOGS/table.txt"
