#!/usr/bin/env bash
# Fuzzes every parser of the project (README, "Fuzzing"):
#   tests/fuzz/run.sh [SECONDS]      build every target, then run each for SECONDS (default 20)
# Environment: FUZZ_TARGETS (names, default all), FUZZ_DIR (default build-fuzz), FUZZ_CXX, JOBS
# (compiles, and targets fuzzed at once; default: the cores).
# Each tests/fuzz/fuzz_NAME.cpp is a libFuzzer target, built with clang and AddressSanitizer +
# UndefinedBehaviorSanitizer; its seeds are small valid files written by make_seeds.cpp with the
# project's own writers. Any crash, sanitizer report, hang (> 10 s on one input), memory blow-up
# (> 2 GiB) or failed FUZZ_CHECK is a finding: the input lands in $FUZZ_DIR/findings/ and the
# script exits 1. Rerun one input with: $FUZZ_DIR/fuzz_NAME FILE.
#
# Why a script and not the CMake build: the targets need only the parsers' sources, not a
# sanitized, instrumented build of the whole engine (its Eigen kernels alone take minutes). Those
# sources also hold code that uses the engine (options.cpp's model_config checks a ModelConfig,
# which lives with the model in layers/transformer.cpp); lld's --gc-sections drops every function
# a target cannot reach, so their references to the rest of the engine need no definition.
# Needs: clang, lld and libFuzzer's runtime (Debian 12: apt-get install clang lld libclang-rt-14-dev).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET=${1:-20}
OUT=${FUZZ_DIR:-build-fuzz}
CXX=${FUZZ_CXX:-clang++}
JOBS=${JOBS:-$(nproc)}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CXXFLAGS="-std=c++17 -O1 -g -fno-omit-frame-pointer -ffunction-sections -fdata-sections -I. -Itests/fuzz $SAN"
LDFLAGS="-fuse-ld=lld -Wl,--gc-sections"
# The parsers, and the files that hold what they call.
SOURCES="engine/llmc_format engine/file_io engine/json engine/checkpoint_files engine/options engine/tokenizer
         engine/tokenizer_json engine/pretokenize engine/unicode_classes engine/nfc engine/safetensors data/shards
         data/dataset data/prepare data/tokenize_files data/json_documents data/input_check layers/transformer layers/rope
         engine/hf_index engine/hf_config"

command -v "$CXX" >/dev/null || { echo "fuzz: $CXX not found (apt-get install clang lld libclang-rt-14-dev)" >&2; exit 1; }
mkdir -p "$OUT/obj" "$OUT/findings" "$OUT/logs"
echo "fuzz | compiling the parsers with $CXX ($JOBS jobs)"
printf '%s\n' $SOURCES | xargs -P "$JOBS" -I{} sh -c \
  "$CXX $CXXFLAGS -fsanitize=fuzzer-no-link -c {}.cpp -o $OUT/obj/\$(echo {} | tr / _).o"
OBJS=$(printf "$OUT/obj/%s.o " $(printf '%s\n' $SOURCES | tr / _))

# Seeds: make_seeds links the same objects but not libFuzzer (it has its own main).
$CXX $CXXFLAGS -fsanitize=fuzzer-no-link $LDFLAGS tests/fuzz/make_seeds.cpp $OBJS -o "$OUT/make_seeds"
rm -rf "$OUT/seeds"
"$OUT/make_seeds" "$OUT/seeds"

# FUZZ_TARGETS="shards cli" runs only those.
TARGETS=${FUZZ_TARGETS:-$(ls tests/fuzz/fuzz_*.cpp | sed 's|.*/fuzz_\(.*\)\.cpp|\1|')}
printf '%s\n' $TARGETS | xargs -P "$JOBS" -I{} sh -c \
  "$CXX $CXXFLAGS -fsanitize=fuzzer $LDFLAGS tests/fuzz/fuzz_{}.cpp $OBJS -o $OUT/fuzz_{}"

# Each input is written to a scratch file (the parsers read paths): on tmpfs that costs ~10 us, on
# a disk-backed /tmp ~200 us, a tenth of the inputs per second.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
# One target: the inputs of earlier findings, then SECONDS_PER_TARGET of fuzzing. Its verdict
# goes to $OUT/logs/$t.verdict (printed in order once all are done); a finding also leaves
# $OUT/logs/$t.failed. libFuzzer runs one process on one core, so JOBS targets run side by side.
fuzz_one() {
  local t=$1 v="$OUT/logs/$1.verdict"
  mkdir -p "$OUT/corpus/$t" "$OUT/seeds/$t"
  if [ -d "$OUT/seeds/regressions/$t" ] &&
     ! "$OUT/fuzz_$t" "$OUT/seeds/regressions/$t"/* >"$OUT/logs/$t.regressions.log" 2>&1; then
    { echo "fuzz | $t: a regression input fails again (log: $OUT/logs/$t.regressions.log)"
      grep -E 'ERROR|FUZZ_CHECK|runtime error' "$OUT/logs/$t.regressions.log" | head -20 || true; } > "$v"
    touch "$OUT/logs/$t.failed"
    return
  fi
  # New inputs go to the first directory (kept between local runs); the seeds are read only.
  if "$OUT/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$OUT/findings/$t-" "$OUT/corpus/$t" "$OUT/seeds/$t" >"$OUT/logs/$t.log" 2>&1; then
    local execs cov
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$OUT/logs/$t.log")
    cov=$(grep -o 'cov: [0-9]*' "$OUT/logs/$t.log" | tail -1)
    echo "fuzz | $t: ok, $execs inputs in ${SECONDS_PER_TARGET}s, $cov" > "$v"
  else
    { echo "fuzz | $t: FINDING (log: $OUT/logs/$t.log)"
      grep -E 'ERROR|FUZZ_CHECK|runtime error|Test unit written' "$OUT/logs/$t.log" | head -20 || true; } > "$v"
    touch "$OUT/logs/$t.failed"
  fi
}
rm -f "$OUT"/logs/*.verdict "$OUT"/logs/*.failed
running=0
for t in $TARGETS; do
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
done
wait
failed=()
for t in $TARGETS; do
  cat "$OUT/logs/$t.verdict"
  [ -e "$OUT/logs/$t.failed" ] && failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz | findings in: ${failed[*]} (inputs under $OUT/findings/)"
  exit 1
fi
echo "fuzz | no findings in $(echo $TARGETS | wc -w) targets"
