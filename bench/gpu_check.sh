#!/usr/bin/env bash
# The GPU check: one command for a machine with one NVIDIA GPU (CUDA 13, cuBLAS, PyTorch; no MPI,
# no apt — Eigen and Catch2 come from .carry/, made by bench/carry_deps.sh on the development
# machine and carried over, or from the system where it has them). Within GPU_CHECK_DEADLINE
# seconds (500 by default: run it with a limit of about 560 s; a build that fails ends it in a
# minute or two, leaving time to mend and run again), in this order:
#   1. build with real CUDA (sm_90, or GPU_CHECK_ARCH: 80 for an A100, 89 for an L40S or RTX 4090,
#      native for the GPU here): train and the benchmarks, then the gpu tests (at most 2 minutes);
#   2. SP on one GPU: the local communicator with 2 ranks against 1 rank, and the NCCL
#      communicator on one rank against the local one (cheap, so before the benchmarks);
#   3. GPT-2 124M (bf16, T = 1024) tokens/s and MFU (and one profiled step: the longest ops);
#   4. attention forward + backward TFLOP/s against PyTorch's scaled_dot_product_attention
#      (default and by backend) at T = 4K, 16K, 64K, head dims 64 and 128, causal;
#   5. the tests labelled gpu (every kernel against the CPU op on the device, cuBLASLt, mma,
#      a training step against the CPU), asynchronous as a run is (the failures again with
#      CUDA_LAUNCH_BLOCKING, which names a faulting kernel): after the headline numbers, so
#      that a slow test run cannot take their time (their build, before them, stops at 2 minutes);
#   6. the memory-bound kernels' GB/s against a device-to-device copy, the classifier's GEMMs by
#      chunk size; --offload's step time and device activations against --recompute alone at
#      T = 16K; 128 query rows a block against 64; one stage of the dk/dv pass against two;
#      packed documents and a sliding window against causal only;
#   7. with time to spare, the bf16 attention kernels' test under compute-sanitizer memcheck.
# Every step runs under `timeout -k` with what is left before the deadline (train catches SIGTERM
# to finish its step: -k kills it if that hangs), a step with too little left is skipped with a
# row saying so, and each row is printed and archived as it is made: a runner that kills the script
# at its own limit still gets every row made so far.
set -uo pipefail
cd "$(dirname "$0")/.."
# Every log goes to gpu_check_out/ (ignored by git). GPU_CHECK_ARCHIVE=DIR also gets, after every
# row, two files: the table and all logs as one archive (for a runner that brings back only a few
# files, and may stop the script at its own time limit).
LOGS=gpu_check_out
DEADLINE=${GPU_CHECK_DEADLINE:-500}
# (the device runner's $OUT when not told: its files are what comes back)
GPU_CHECK_ARCHIVE=${GPU_CHECK_ARCHIVE:-${OUT:-}}
rm -rf "$LOGS" && mkdir -p "$LOGS"
: > "$LOGS/table.txt"
archive() {
  [ -n "${GPU_CHECK_ARCHIVE:-}" ] || return 0
  # (the archive under a temporary name, then moved: a kill mid-write keeps the last whole one)
  mkdir -p "$GPU_CHECK_ARCHIVE" && cp "$LOGS/table.txt" "$GPU_CHECK_ARCHIVE/" &&
    tar czf "$GPU_CHECK_ARCHIVE/gpu_check_logs.tgz.tmp" -C "$LOGS" . 2>/dev/null &&
    mv -f "$GPU_CHECK_ARCHIVE/gpu_check_logs.tgz.tmp" "$GPU_CHECK_ARCHIVE/gpu_check_logs.tgz"
}
# At the end, however the script ends (a failed build's exit included): the archive, and the table
# printed last.
finish() {
  archive
  echo
  echo "== summary"
  cat "$LOGS/table.txt"
}
trap finish EXIT
export PATH="$PATH:/usr/local/cuda/bin"
row() {
  printf '%-44s %s\n' "$1" "$2" | tee -a "$LOGS/table.txt"
  archive
}
# left N: seconds a step may take: N, or what is left before the deadline less 10 s, if less.
left() { local l=$((DEADLINE - SECONDS - 10)); echo $((l < $1 ? l : $1)); }
# run_for N LOG cmd...: cmd under timeout with left(N) seconds, output to LOG; status 124 when it
# ran out of time, 125 when it was skipped (under 15 s left).
run_for() {
  local t log=$2; t=$(left "$1"); shift 2
  if [ "$t" -lt 15 ]; then echo "skipped: ${SECONDS} s of ${DEADLINE} used" > "$log"; return 125; fi
  timeout -k 10 "$t" "$@" > "$log" 2>&1
}
# A benchmark's outcome for a row when it printed nothing to parse.
why() { case $1 in 124|137) echo "timed out (see $2)" ;; 125) echo "skipped (out of time)" ;; *) echo "no result (exit $1, see $2)" ;; esac; }

gpu=$(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
row "machine" "${gpu:-no nvidia-smi} | nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1) | g++ $(c++ -dumpversion 2>/dev/null) | cmake $(cmake --version 2>/dev/null | head -1 | grep -o '[0-9.]*$') | torch $(timeout 30 python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none) | $(date -u +%F)"
# Eigen and Catch2 from .carry/, else from the system (a machine with the Debian packages).
has() { [ -f ".carry/$1" ] || [ -f "/usr/$1" ] || [ -f "/usr/local/$1" ]; }
# (Catch2's CMake package refuses to load without its library: a .carry made before it was copied
# passed a check of the header alone and failed the whole build.)
missing=""
for f in share/eigen3/cmake/Eigen3Config.cmake include/catch2/catch.hpp lib/cmake/Catch2/Catch2Config.cmake; do
  has "$f" || missing="$missing $f"
done
[ -f .carry/lib/cmake/Catch2/Catch2Config.cmake ] && [ ! -f .carry/lib/libCatch2WithMain.a ] &&
  missing="$missing lib/libCatch2WithMain.a"
if [ -n "$missing" ]; then
  row "build" "FAILED: not in .carry/ or the system:$missing (run bench/carry_deps.sh where Eigen and Catch2 are installed, and carry .carry)"
  exit 1
fi

echo "== build (${SECONDS} s)"
# Only what this script runs (not the cpu tests): about a minute on 16 cores. Ninja when the image
# has it (make may be missing). If nvcc refuses the machine's g++ as too new (a bare image may pair
# them so), the build is retried once telling it to accept it, and the table says so. The gpu
# tests build apart: a failure there still leaves the benchmarks.
gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
arch=${GPU_CHECK_ARCH:-90}
configure() {
  run_for 120 "$LOGS/configure.log" cmake -S . -B build-gpu ${gen[@]+"${gen[@]}"} -DULYSSES_CUDA=ON -DULYSSES_WITH_MPI=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_PREFIX_PATH="$PWD/.carry" -DULYSSES_TEST_TIMEOUT=60 "$@"
}
build() { run_for "${BUILD_S:-300}" "$LOGS/$1.log" cmake --build build-gpu -j "$(nproc)" --target "${@:2}"; }
note=""
# A machine kept warm between calls keeps build-gpu/: the programs of an earlier build are removed
# first, so that only this build's can pass the checks below (a failed rebuild once reported "ok"
# and benchmarked the old code).
rm -f build-gpu/train build-gpu/bench_* build-gpu/tests/test_*
# What the table needs first; bench_kernels (optional) builds apart, so that an error there cannot
# stop the build before the others link.
built=1
if ! { configure && build build train bench_gpt2_step bench_attention; }; then
  built=0
  # (grep -s over both: a configure that failed wrote no build.log, and a cat of it failed the
  # pipeline under pipefail, so the retry never ran)
  if grep -qs "unsupported GNU version" "$LOGS/configure.log" "$LOGS/build.log"; then
    rm -rf build-gpu
    note=", with -allow-unsupported-compiler (g++ $(c++ -dumpversion))"
    configure -DCMAKE_CUDA_FLAGS=-allow-unsupported-compiler && build build train bench_gpt2_step bench_attention &&
      built=1
  fi
fi
if [ "$built" = 1 ] && [ -x build-gpu/train ] && [ -x build-gpu/bench_attention ] && [ -x build-gpu/bench_gpt2_step ]; then
  row "build (nvcc, sm_$arch): train, benchmarks" "ok${note} (${SECONDS} s)"
else
  row "build (nvcc, sm_$arch): train, benchmarks" "FAILED (see $LOGS/configure.log, $LOGS/build.log)"
  for f in "$LOGS/configure.log" "$LOGS/build.log"; do [ -f "$f" ] && tail -n 30 "$f"; done
  exit 1
fi
BUILD_S=120 build build_tests tests_gpu; tests_built=$?
if [ "$tests_built" -eq 0 ]; then row "build: the gpu tests" "ok (${SECONDS} s)"
else row "build: the gpu tests" "FAILED: $(why $tests_built "$LOGS/build_tests.log")"; fi
build build_kernels bench_kernels || row "build: bench_kernels" "FAILED (see $LOGS/build_kernels.log)"

echo "== SP on one GPU (local communicator) (${SECONDS} s)"
common="--device cuda --precision fp32 --steps 5 --seq 256 --batch 2 --eval-every 0 --eval-batches 1"
run_for 60 "$LOGS/sp1.log" ./build-gpu/train $common --ranks 1; rc1=$?
run_for 60 "$LOGS/sp2.log" ./build-gpu/train $common --ranks 2 --sp 2; rc2=$?
l1=$(grep -o 'train loss [0-9.]* -> [0-9.]*' "$LOGS/sp1.log"); l2=$(grep -o 'train loss [0-9.]* -> [0-9.]*' "$LOGS/sp2.log")
verdict=""; [ -n "$l1" ] && [ -n "$l2" ] && { [ "$l1" = "$l2" ] && verdict=" | the same" || verdict=" | DIFFER"; }
row "sp 2 vs sp 1 losses (fp32)" "${l2:-$(why $rc2 "$LOGS/sp2.log")} | ${l1:-$(why $rc1 "$LOGS/sp1.log")}$verdict"
# The real NCCL communicator (only the emulated one runs in CI): a world of one rank through
# --nccl-id-file (no MPI here) runs its init, the id file, the start-up all-gathers of host ints
# (staged) and finish()'s polling; its losses must be the local communicator's.
# (cmake/cuda.cmake compiles NCCL in when it finds both the library and nccl.h)
if grep -q '^ULYSSES_NCCL_LIBRARY:FILEPATH=/' build-gpu/CMakeCache.txt 2>/dev/null &&
   grep -q '^ULYSSES_NCCL_INCLUDE:PATH=/' build-gpu/CMakeCache.txt; then
  run_for 60 "$LOGS/nccl1.log" env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 ULYSSES_JOB_ID="gpu_check_$$" \
    ./build-gpu/train $common --comm nccl --nccl-id-file "$LOGS/nccl_id"; rc=$?
  ln=$(grep -o 'train loss [0-9.]* -> [0-9.]*' "$LOGS/nccl1.log")
  verdict=""; [ -n "$l1" ] && [ -n "$ln" ] && { [ "$l1" = "$ln" ] && verdict=" | the same" || verdict=" | DIFFER"; }
  row "nccl 1 rank vs local 1 rank losses (fp32)" "${ln:-$(why $rc "$LOGS/nccl1.log")} | ${l1:-no local run}$verdict"
else
  row "nccl 1 rank vs local 1 rank losses (fp32)" "skipped (this build found no NCCL)"
fi

echo "== GPT-2 124M, bf16, T = 1024 (${SECONDS} s)"
# B = 32 first (the MFU target; llm.c's H100 figures use large batches), then B = 8 (launch
# overheads). --profile: one more step with each op's GPU time (B = 32's longest in the table).
# MFU counts 6 N per token plus attention's 6 L T C per token (llm.c's), over the best step of 10;
# the median step's tokens/s beside it.
for b in 32 8; do
  run_for 120 "$LOGS/gpt2_b$b.log" ./build-gpu/bench_gpt2_step --device cuda --precision bf16 --batch $b --seq 1024 \
    --steps 10 --profile; rc=$?
  tps=$(grep -o 'tokens/s [0-9.]*' "$LOGS/gpt2_b$b.log" | tail -1); mfu=$(grep -o 'MFU [0-9.]*%' "$LOGS/gpt2_b$b.log" | tail -1)
  med=$(grep -o 'median [0-9.]* ms' "$LOGS/gpt2_b$b.log" | tail -1 | awk -v n=$((b * 1024)) '{printf "%.0f", n / ($2 / 1000)}')
  row "GPT-2 124M bf16 T=1024 B=$b tokens/s (best), MFU" \
    "${tps:-$(why $rc "$LOGS/gpt2_b$b.log")}${mfu:+, $mfu}${med:+ | median step: tokens/s $med}"
done
# The longest ops of the B = 32 profiled step (bench_gpt2_step --profile: "ms % calls TFLOP/s op").
sed -n '/^profile:/,$p' "$LOGS/gpt2_b32.log" | awk 'NR > 2 && NR <= 10' | while read -r ms pct calls rate op; do
  row "  B=32 op: $op" "$ms ms, $pct%, $calls calls, TFLOP/s $rate"
done

echo "== attention vs PyTorch SDPA (${SECONDS} s)"
# Both best of 5, both timed with CUDA events around the calls (the host's launches included);
# TFLOP/s = forward 4 T^2 D H / 2 (causal) x 3.5 for forward + backward, both sides.
run_for 150 "$LOGS/attn_ours.log" ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 \
  --seqs 4096,16384,65536 --dims 64,128 --reps 5; rc_ours=$?
run_for 150 "$LOGS/attn_sdpa.log" python3 bench/sdpa_reference.py --seqs 4096,16384,65536 --dims 64,128 --heads 16
# sdpa_reference.py prints "T D fwd_ms fwd_bwd_ms TFLOP/s backend", backend default, flash, cudnn, ...
sdpa() { awk -v T="$1" -v D="$2" -v B="$3" '$1 == T && $2 == D && $6 == B {print $5}' "$LOGS/attn_sdpa.log"; }
while read -r dev dt T D f fb tf doc rows; do
  [ "$dev" = cuda ] || continue
  ref=$(sdpa "$T" "$D" default); against=default
  if ! awk -v b="${ref:-0}" 'BEGIN { exit !(b + 0 > 0) }'; then  # PyTorch's own choice failed here: its fastest backend
    against=$(awk -v T="$T" -v D="$D" '$1 == T && $2 == D && $5 + 0 > 0 && $6 != "default" {print $5, $6}' \
      "$LOGS/attn_sdpa.log" | sort -rn | head -1)
    ref=${against%% *}; against=${against#* }
  fi
  ratio=$(awk -v a="$tf" -v b="${ref:-0}" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "n/a" }')
  row "attention T=$T D=$D TFLOP/s (ours | SDPA)" \
    "$tf | ${ref:-n/a} | ratio $ratio against ${against:-none} | flash $(sdpa "$T" "$D" flash) cudnn $(sdpa "$T" "$D" cudnn)"
done < "$LOGS/attn_ours.log"
grep -q '^cuda ' "$LOGS/attn_ours.log" || row "attention vs SDPA" "$(why $rc_ours "$LOGS/attn_ours.log")"
grep -q ' default$' "$LOGS/attn_sdpa.log" || row "  SDPA" "no rows (see $LOGS/attn_sdpa.log)"

echo "== tests labelled gpu (${SECONDS} s)"
# A minute at most per test (ULYSSES_TEST_TIMEOUT at the configure: one that hangs costs that, not
# the run; ctest's --timeout does not override a test's own); four at once on the one GPU,
# each with 4 OpenMP threads for its CPU reference (16 cores: more would spin against each other).
# Asynchronous, as a training run is (CUDA_LAUNCH_BLOCKING would finish every kernel before the
# next call, and hide a copy on --offload's side stream that does not wait for the kernel making
# its source), with the arena poisoned as CI's emulated runs are; then the failures alone again
# with it, where a kernel's fault is reported at its launch, naming it.
if [ "$tests_built" -eq 0 ] && [ -x build-gpu/tests/test_attention_gpu ]; then
  # (ctest's list of failures is this run's only when it ends: a kept build-gpu/ has the last call's)
  rm -f build-gpu/Testing/Temporary/LastTestsFailed.log
  (cd build-gpu && ULYSSES_POISON_ARENA=1 OMP_NUM_THREADS=4 run_for 150 "../$LOGS/ctest_gpu.log" ctest -L gpu \
    --output-on-failure -j 4); rc=$?
  summary=$(grep -E 'tests passed|tests failed' "$LOGS/ctest_gpu.log" | tail -1)
  if [ -z "$summary" ]; then  # cut off before its summary: count the tests that ended
    summary="$(grep -c ' Passed ' "$LOGS/ctest_gpu.log") passed, $(grep -cE '\*\*\*(Failed|Timeout|Exception)' \
      "$LOGS/ctest_gpu.log") failed before it stopped: $(why $rc "$LOGS/ctest_gpu.log")"
  fi
  row "ctest -L gpu" "$summary"
  # The failures: "N/M Test #K: name ...***Failed" as each test ends (the summary's list may be cut off).
  grep -E '\*\*\*(Failed|Timeout|Exception)' "$LOGS/ctest_gpu.log" | head -8 | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //' |
    while read -r line; do row "  failed" "$line"; done
  if grep -qE '\*\*\*(Failed|Exception)' "$LOGS/ctest_gpu.log" && [ -s build-gpu/Testing/Temporary/LastTestsFailed.log ]; then
    (cd build-gpu && CUDA_LAUNCH_BLOCKING=1 ULYSSES_POISON_ARENA=1 OMP_NUM_THREADS=4 run_for 90 \
      "../$LOGS/ctest_gpu_blocking.log" ctest --rerun-failed --output-on-failure -j 4)
    row "  again with CUDA_LAUNCH_BLOCKING=1" \
      "$(grep -E 'tests passed|tests failed' "$LOGS/ctest_gpu_blocking.log" | tail -1) (see $LOGS/ctest_gpu_blocking.log)"
  fi
else
  row "ctest -L gpu" "skipped (the gpu tests did not build)"
fi

echo "== memory-bound kernels against a device-to-device copy (GPT-2 124M shapes) (${SECONDS} s)"
run_for 60 "$LOGS/kernels.log" ./build-gpu/bench_kernels; rc=$?
# Lines "name ... X GB/s R" after the header; the three with the lowest ratio to the copy (not
# counting the baselines, the older ways timed beside two of the kernels: rows below).
copy=$(grep -o 'cudaMemcpy device to device .* GB/s' "$LOGS/kernels.log" | grep -o '[0-9.]* GB/s')
worst=$(awk '/^kernel/ {on = 1; next} /\((2 reads|4-byte loads)\)/ {next}
  on && / GB\/s / {r = $NF; $NF = ""; sub(/ +[0-9.]+ MB .*/, ""); print r, $0}' \
  "$LOGS/kernels.log" | sort -n | head -3 | awk '{r = $1; $1 = ""; sub(/^ +/, ""); printf "%s%s %s", (NR > 1 ? ", " : ""), $0, r}')
row "kernels vs copy (${copy:-no result}): lowest" "${worst:-$(why $rc "$LOGS/kernels.log")}"
# Two kernels against their own older way, timed in the same run: the classifier's softmax with
# its row staged in shared memory against the row read twice, AdamW 16-byte against 4-byte loads.
# (The ms of a line is its fifth field from the end.)
than() {
  awk -v a="$1" -v b="$2" 'index($0, a) == 1 {x = $(NF - 4)} index($0, b) == 1 {y = $(NF - 4)}
    END {if (x && y) printf "%s ms against %s ms (%.2fx)", x, y, y / x}' "$LOGS/kernels.log"
}
soft=$(than "softmax_cross_entropy (smem row)" "softmax_cross_entropy (2 reads)")
grep -q "^softmax_cross_entropy (not staged)" "$LOGS/kernels.log" && soft="not staged: the row does not fit a block here"
row "classifier softmax, row in smem vs read twice" "${soft:-$(why $rc "$LOGS/kernels.log")}"
adam=$(than "adamw_update (all parameters)" "adamw_update (4-byte loads)")
row "adamw_update, 16-byte vs 4-byte loads" "${adam:-$(why $rc "$LOGS/kernels.log")}"
# Then "rows logits dx dw" TFLOP/s of the classifier's GEMMs at 1, 2, 4 x the chunk's rows.
gemms=$(awk '/^chunk rows/ {on = 1; next} on && NF == 4 {printf "%s%s: %s/%s/%s", (n++ ? "; " : ""), $1, $2, $3, $4}' \
  "$LOGS/kernels.log")
row "classifier GEMMs logits/dx/dw TFLOP/s by rows" "${gemms:-n/a (see $LOGS/kernels.log)}"

echo "== --offload against --recompute alone (gpt2-124M, bf16, T = 16384) (${SECONDS} s)"
lc="--device cuda --model gpt2-124M --batch 1 --seq 16384 --steps 4 --eval-every 0 --eval-batches 1 --recompute --mlp-chunks 4"
rm -f "$LOGS/recompute.jsonl" "$LOGS/offload.jsonl"
run_for 90 "$LOGS/recompute.log" ./build-gpu/train $lc --log "$LOGS/recompute.jsonl"; rc_r=$?
run_for 90 "$LOGS/offload.log" ./build-gpu/train $lc --offload --log "$LOGS/offload.jsonl"; rc_o=$?
step_ms() { grep -o '| [0-9.]* ms |' "$1" | tail -1 | grep -o '[0-9.]*'; }
act_mib() { grep -o 'act [0-9.]* MiB' "$1" | tail -1 | grep -o '[0-9.]*'; }
ms_act() { local ms act; ms=$(step_ms "$1"); act=$(act_mib "$1"); if [ -n "$ms" ]; then echo "$ms ms, $act MiB"; else why "$2" "$1"; fi; }
# (and every step's loss, which must be the same bits: the logs' 17 digits; the one run of
# --offload's side-stream copies on hardware with nothing serialised)
losses() { grep -o '"loss":[^,]*' "$1" 2>/dev/null | tr '\n' ' '; }
lr=$(losses "$LOGS/recompute.jsonl"); lo=$(losses "$LOGS/offload.jsonl")
verdict=""; [ -n "$lr" ] && [ -n "$lo" ] && { [ "$lr" = "$lo" ] && verdict=" | losses the same bits" || verdict=" | losses DIFFER"; }
row "step ms, act MiB: recompute | + offload" "$(ms_act "$LOGS/recompute.log" $rc_r) | $(ms_act "$LOGS/offload.log" $rc_o)$verdict"

echo "== attention with 128 query rows a block (forward and dq pass) against 64 (${SECONDS} s)"
# The same kernels with twice the rows per block: each K/V tile fetched serves twice the rows (see
# RESULTS.md, FLOPs per byte), at fewer blocks per SM. The faster one should be the default.
run_for 90 "$LOGS/attn_rows128.log" ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 \
  --seqs 16384,65536 --dims 64,128 --reps 5 --query-rows 128; rc=$?
while read -r dev dt T D f fb tf doc rows; do
  [ "$dev" = cuda ] || continue
  base=$(awk -v T="$T" -v D="$D" '$1 == "cuda" && $3 == T && $4 == D {print $5 " " $6}' "$LOGS/attn_ours.log")
  row "attention T=$T D=$D fwd | fwd+bwd ms, 64 rows -> 128 rows" "${base:-n/a} -> $f $fb"
done < "$LOGS/attn_rows128.log"
grep -q '^cuda ' "$LOGS/attn_rows128.log" || row "attention, 128 query rows" "$(why $rc "$LOGS/attn_rows128.log")"

echo "== attention's dk/dv pass with one stage of (Q, dout) tiles against two, at D = 128 (${SECONDS} s)"
# One stage is what sm_86/89/120 run (a block there holds 99 KiB); on an A100 it also lets two
# blocks share an SM where two stages fit one. Which is faster where both fit decides the default.
run_for 60 "$LOGS/attn_dkv1.log" ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 --seqs 16384 \
  --dims 128 --reps 5 --dkv-stages 1; rc=$?
two_ms=$(awk '$1 == "cuda" && $3 == 16384 && $4 == 128 {print $6}' "$LOGS/attn_ours.log")
one_ms=$(awk '$1 == "cuda" && $3 == 16384 && $4 == 128 {print $6}' "$LOGS/attn_dkv1.log")
row "attention T=16K D=128 fwd+bwd ms: dk/dv 2 stages | 1 stage" "${two_ms:-n/a} | ${one_ms:-$(why $rc "$LOGS/attn_dkv1.log")}"

echo "== attention with packed 2K-token documents (tiles that share none are skipped) (${SECONDS} s)"
# Rising ids (as packing makes them: the documents' tiles found by bisection), then the same
# documents numbered down (--falling-ids: every earlier tile's ids tested, the walk they replaced).
run_for 60 "$LOGS/attn_docs.log" ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 --seqs 16384,65536 \
  --dims 64 --reps 5 --doc-len 2048; rc_docs=$?
run_for 60 "$LOGS/attn_docs_walk.log" ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 \
  --seqs 16384,65536 --dims 64 --reps 5 --doc-len 2048 --falling-ids; rc_walk=$?
# at LOG T RC: the fwd+bwd ms of the D = 64 row at T in LOG, else why there is none.
at() { local v; v=$(awk -v T="$2" '$1 == "cuda" && $3 == T && $4 == 64 {print $6}' "$1" 2>/dev/null); echo "${v:-$(why "$3" "$1")}"; }
for T in 16384 65536; do
  row "attention T=$((T / 1024))K D=64 fwd+bwd ms: causal | 2K docs | walked" \
    "$(at "$LOGS/attn_ours.log" "$T" "$rc_ours") | $(at "$LOGS/attn_docs.log" "$T" $rc_docs) | $(at "$LOGS/attn_docs_walk.log" "$T" $rc_walk)"
done

echo "== attention with a 4K-token sliding window at T = 64K (tiles older than the window skipped) (${SECONDS} s)"
run_for 60 "$LOGS/attn_window.log" ./build-gpu/bench_attention --device cuda --dtype bf16 --heads 16 --seqs 65536 \
  --dims 64 --reps 5 --window 4096; rc_window=$?
row "attention T=64K D=64 fwd+bwd ms: causal | 4K window" \
  "$(at "$LOGS/attn_ours.log" 65536 "$rc_ours") | $(at "$LOGS/attn_window.log" 65536 $rc_window)"

# With time to spare: the tensor-core attention kernels under compute-sanitizer's memcheck, for
# out-of-bounds and misaligned accesses that the tests' comparisons might not show. Some machines'
# runtimes do not support it; the row then says so.
if [ "$(left 150)" -ge 60 ] && command -v compute-sanitizer > /dev/null && [ -x build-gpu/tests/test_attention_gpu ]; then
  echo "== compute-sanitizer memcheck: the bf16 attention kernels (${SECONDS} s)"
  run_for 150 "$LOGS/memcheck.log" compute-sanitizer --tool memcheck --error-exitcode 9 \
    ./build-gpu/tests/test_attention_gpu "attention CUDA kernels match the CPU backend (bf16*"
  rc=$?
  row "memcheck, bf16 attention kernels (exit $rc)" \
    "$(grep -o 'ERROR SUMMARY: [0-9]* errors*' "$LOGS/memcheck.log" | tail -1 || true)"
else
  row "memcheck, bf16 attention kernels" "skipped ($((DEADLINE - SECONDS)) s left, no compute-sanitizer, or no test binary)"
fi

row "done" "${SECONDS} s of ${DEADLINE}"
