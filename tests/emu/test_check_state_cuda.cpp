// --check-state on the CUDA backend (emulated in CI) against the independent PyTorch float64
// GPT-2 reference (tools/reference_gpt2.py --head-dim-32: head dim 32, which the CUDA attention
// supports), in fp32, on one rank and under dp x sp layouts with device buffers, and with the
// memory flags.
#include <catch2/catch.hpp>

#include "run_cmd.h"

using namespace ul_test;

TEST_CASE("check-state passes on the CUDA backend against the PyTorch reference (fp32)", "[emu][reference]") {
  const std::string files = "--checkpoint " + source_path("tests/data/gpt2_d32_model.bin") + " --check-state " +
                            source_path("tests/data/gpt2_d32_state.bin");
  // (and with the memory flags, which run the same step another way: the block inputs replayed,
  // kept in pinned host memory, the MLP in slices)
  for (const char* layout : {"", "--ranks 2 --sp 2", "--ranks 2 --sp 1", "--recompute --offload --mlp-chunks 2"}) {
    CmdResult r = run_cmd(train_cmd("--device cuda --precision fp32 " + files + " " + layout));
    INFO("layout '" << layout << "'\n" << r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("check-state: PASS") != std::string::npos);
  }
  // Without --precision it runs in fp32 too (bf16 is --device cuda's default for training only: a
  // bf16 step fails every tensor of an fp32 reference by its rounding), and the verdict says which.
  CmdResult r = run_cmd(train_cmd("--device cuda " + files));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find(", fp32, dp 1 x sp 1, tolerance") != std::string::npos);
  r = run_cmd(train_cmd("--device cuda --precision bf16 " + files));
  CHECK(r.code == 1);
  CHECK(r.out.find("check-state: FAIL") != std::string::npos);
  CHECK(r.out.find("this step ran in bf16, against an fp32 reference: --precision fp32 checks") != std::string::npos);
}
