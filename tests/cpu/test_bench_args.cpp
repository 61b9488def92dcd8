// The benchmarks' flags (bench/bench_args.h): parsed values in this process; the refusals, which
// exit, through the benchmark programs themselves.
#include "bench/bench_args.h"

#include <catch2/catch.hpp>

#include "run_cmd.h"

using namespace ul_test;

TEST_CASE("benchmark flags: values, name=value, defaults, lists and switches", "[bench]") {
  std::vector<std::string> words = {"bench_x", "--reps", "7", "--shift=-3", "--seqs", "1024,4096", "--profile",
                                    "--memory", "2G", "--offset", "-5", "--reps", "8"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(&w[0]);
  BenchArgs args(int(argv.size()), argv.data(), "usage: bench_x");
  CHECK(args.integer("--reps", 5) == 8);  // the last occurrence wins
  CHECK(args.integer("--shift", 0) == -3);
  CHECK(args.integer("--offset", 0) == -5);  // "-5" is a value, not a flag
  CHECK(args.ints("--seqs", {1}) == std::vector<int>{1024, 4096});
  CHECK(args.flag("--profile"));
  CHECK_FALSE(args.flag("--quiet"));
  CHECK(args.bytes("--memory", 1) == 2.0 * 1024 * 1024 * 1024);
  CHECK(args.integer("--steps", 9) == 9);
  CHECK(args.text("--device", "cpu") == "cpu");
  CHECK(args.given("--seqs"));
  CHECK_FALSE(args.given("--dims"));
  args.done();  // every flag was read: returns (an unknown one would exit the test with status 2)
}

TEST_CASE("benchmarks refuse bad flags with the flag's name and their usage, before timing anything", "[bench]") {
  const std::string dir = ULYSSES_BENCH_DIR;
  struct Case {
    std::string cmd, says;
    int code;
  };
  const Case cases[] = {
      {"bench_gemm --bogus 1", "unknown flag --bogus", 2},
      {"bench_gemm --reps x", "--reps: expected an integer, got 'x'", 2},
      {"bench_gemm --reps", "--reps needs a value", 2},
      {"bench_gemm 3", "unexpected argument '3'", 2},
      {"bench_gemm --reps 0", "--reps must be >= 1, got 0", 2},
      {"bench_gpt2_step --threads 5000", "--threads must be <= 4096, got 5000", 2},
      {"bench_long_context --memory 24X", "--memory: expected a positive size like 24G (bytes, or K, M, G, T", 2},
      {"bench_gpt2_step --profile 3", "--profile takes no value (got '3')", 2},
      {"bench_gpt2_step --peak-tflops x", "--peak-tflops: expected a number, got 'x'", 2},
      {"bench_gpt2_step --peak-tflops 0", "--peak-tflops must be a finite number > 0, got 0", 2},
      {"bench_gpt2_step --peak-tflops inf", "--peak-tflops must be a finite number > 0, got inf", 2},
      {"bench_attention --seqs 1024,x", "--seqs: expected an integer, got 'x'", 2},
      // a device or precision it does not know once ran as the CPU's fp32, under its own name
      {"bench_gpt2_step --device gpu", "--device: expected cpu or cuda, got 'gpu'", 2},
      {"bench_gpt2_step --device cuda --precision fp16", "--precision: expected fp32 or bf16, got 'fp16'", 2},
      {"bench_gpt2_step --precision bf16", "--precision bf16: the CPU backend runs fp32 only", 2},
      {"bench_attention --dtype bf16", "--dtype bf16: the CPU backend runs f32 only", 2},
      {"bench_sp_scaling --sp 1,0", "--sp must be >= 1, got 0", 2},
      {"bench_attention --falling-ids", "--falling-ids needs --doc-len", 2},  // exited 1, no usage
      {"bench_attention --device gpu", "--device: expected cpu or cuda, got 'gpu'", 2},
      {"bench_gpt2_step --profile", "--profile times GPU ops: it needs --device cuda", 2},  // before the model
      // every configuration failed (8 heads over sp 3): the table's "failed" row once exited 0
      {"bench_sp_scaling --sp 3", "sp 3: ", 1},
      {"bench_gemm --help", "usage: bench_gemm [--reps 5] [--threads N", 0},
  };
  for (const Case& c : cases) {
    CmdResult r = run_cmd(dir + "/" + c.cmd);
    INFO(c.cmd << "\n" << r.out);
    CHECK(r.code == c.code);
    CHECK(r.out.find(c.says) != std::string::npos);
    if (c.code == 2) CHECK(r.out.find("usage: ") != std::string::npos);
  }
}
