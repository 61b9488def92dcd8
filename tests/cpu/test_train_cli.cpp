// The train binary end to end: bad input is refused with a message naming the flag or file and a
// non-zero exit; the reference state passes; a short run learns.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "run_cmd.h"

using namespace ul_test;
namespace fs = std::filesystem;

static void expect_refused(const std::string& args, const std::string& needle) {
  CmdResult r = run_cmd(train_cmd(args));
  INFO("train " << args << "\n" << r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find(needle) != std::string::npos);
}

TEST_CASE("train refuses bad flags before any work", "[cli]") {
  expect_refused("--no-such-flag", "unknown flag '--no-such-flag'");
  expect_refused("--steps", "--steps: missing value");
  expect_refused("--batch x", "--batch: expected an integer");
  expect_refused("--batch 0", "--batch must be >= 1");
  expect_refused("--model gpt3", "--model: unknown model 'gpt3'");
  expect_refused("--dim 100 --heads 3", "not divisible by --heads");
  expect_refused("--check-state x.bin", "--check-state needs --checkpoint");
  expect_refused("--data nonsense", "nonsense");
  expect_refused("--data passkey:depth=2", "depth is a fraction in [0, 1]");
  expect_refused("--data recall:gap=x", "'gap' needs a number");
  expect_refused("--data recall:foo=1", "unknown setting 'foo'");
  expect_refused("--comm carrier-pigeon", "--comm");
  expect_refused("--offload --recompute", "--offload moves block inputs from GPU memory");
  expect_refused("--offload --device cuda --plan", "--offload needs --recompute");
  expect_refused("--profile-step 2", "--profile-step times GPU ops with CUDA events: it needs --device cuda");
  expect_refused("--profile-step 0 --device cuda --plan", "--profile-step must be >= 1");
  expect_refused("--profile-step 9 --steps 5 --device cuda --plan", "--profile-step 9 is past the last step");
  // Numbers that parse but mean nothing sane: refused, not trained on.
  expect_refused("--batch 4294967297", "--batch: 4294967297 is out of range");  // int(...) would make it 1
  expect_refused("--steps 99999999999999999999", "--steps: 99999999999999999999 is out of range");
  expect_refused("--lr inf", "--lr must be a finite number > 0");
  expect_refused("--lr 1e39", "--lr must be a finite number > 0");  // inf as a float
  expect_refused("--final-lr-frac 2", "--final-lr-frac must be in [0, 1]");
  expect_refused("--final-lr-frac nan", "--final-lr-frac must be in [0, 1]");
  expect_refused("--weight-decay -0.1", "--weight-decay must be a finite number >= 0");
  expect_refused("--grad-clip -1", "--grad-clip must be a finite number >= 0");
  expect_refused("--rope-theta 0", "--rope-theta must be a finite number > 0");
  expect_refused("--seed -1", "--seed must be >= 0");
  expect_refused("--temperature 1e39 --sample 3 --prompt ab", "--temperature must be a finite number >= 0");
  // The model overrides mean "the preset's" at 0 only by default; written out, 0 is refused.
  for (const char* f : {"--layers", "--dim", "--heads", "--kv-heads", "--vocab", "--max-seq", "--ffn"})
    expect_refused(std::string(f) + " 0", std::string(f) + " must be >= 1");
}

TEST_CASE("train --plan plans a GPU run in any build, offload included", "[cli][planner]") {
  CmdResult r = run_cmd(train_cmd("--plan --model gpt2-124M --device cuda --recompute --offload --seq 8192 "
                                  "--memory 141G"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("cuda bf16 | recompute | offload") != std::string::npos);
  CHECK(r.out.find("pinned host memory") != std::string::npos);
  CHECK(r.out.find("longest --seq that fits") != std::string::npos);
}

TEST_CASE("train --help lists the flags and exits 0", "[cli]") {
  CmdResult r = run_cmd(train_cmd("--help"));
  CHECK(r.code == 0);
  for (const char* f : {"--model", "--layers", "--dim", "--heads", "--kv-heads", "--vocab", "--max-seq", "--data", "--batch",
                        "--seq", "--steps", "--lr", "--warmup", "--weight-decay", "--grad-clip", "--seed", "--threads",
                        "--eval-every", "--checkpoint", "--check-state", "--sp", "--grad-accum", "--comm", "--ranks"})
    CHECK(r.out.find(f) != std::string::npos);
}

TEST_CASE("train refuses bad files with a message naming them", "[cli]") {
  fs::path dir = fs::temp_directory_path() / ("ulysses_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string bad = (dir / "bad_magic.bin").string();
  { std::ofstream f(bad, std::ios::binary); int h[256] = {12345, 3}; f.write((char*)h, sizeof h); }
  expect_refused("--checkpoint " + bad + " --steps 1", "bad_magic.bin");
  std::string model = source_path("tests/data/gpt2_tiny_model.bin");
  std::string trunc = (dir / "truncated.bin").string();
  {
    std::ifstream in(model, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    std::ofstream f(trunc, std::ios::binary);
    f.write(all.data(), all.size() / 2);
  }
  expect_refused("--checkpoint " + trunc + " --steps 1", "truncated.bin");
  expect_refused("--checkpoint " + model + " --check-state " + trunc, "truncated.bin");
  // Bytes >= 100 in a text file are token ids outside --vocab 100.
  std::string text = (dir / "text.txt").string();
  { std::ofstream f(text); for (int i = 0; i < 400; i++) f << "zzzz hello world "; }
  expect_refused("--data text:" + text + " --vocab 100 --steps 1 --seq 32", "text.txt");
  fs::remove_all(dir);
}

TEST_CASE("train --check-state passes on the committed reference", "[cli][reference]") {
  std::string args = "--checkpoint " + source_path("tests/data/gpt2_tiny_model.bin") + " --check-state " +
                     source_path("tests/data/gpt2_tiny_state.bin");
  CmdResult r = run_cmd(train_cmd(args));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("check-state: PASS") != std::string::npos);
  for (const char* name : {"logits", "loss", "wte", "wpe", "qkvw", "fcprojb", "lnfb"})
    CHECK(r.out.find(name) != std::string::npos);
}
