// `train --device cuda` end to end on the emulated device: the cases shared with the GPU test
// (tests/emu/train_cuda_cases.h), and those that need several ranks on device buffers, which the
// local communicator can move only where device memory is host memory (the emulation):
//   - Ulysses sp 2 vs sp 1 on one sequence batch: the loss and the world-summed gradient, fp32,
//     within 1e-5 (of each tensor's largest element);
//   - dp 2 vs one process on the same sequences: every step's loss and the weights after 3 steps,
//     fp32, within 1e-5;
//   - ZeRO-1 over dp 2: fp32 bitwise equal to plain dp 2; bf16 keeps every rank's bf16 weights and
//     masters bitwise equal (each shard's owner rounds, the others take its bits);
//   - --check-state on llm.c's tiny GPT-2 reference state passes in fp32, sp 1 and sp 2.
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/train_cuda_cases.h"

#include "engine/check_state.h"

namespace train_cases {

TEST_CASE("train --device cuda: sp 2 equals sp 1 (emulated device buffers)", "[emu]") {
  for (const char* arch : kArchs) {
    INFO("--model " << arch);
    const std::string a = std::string("--model ") + arch + " --device cuda --precision fp32";
    Run one = train(a + " --sp 1", 1, 1), two = train(a + " --sp 2", 2, 1);
    CHECK(rel_diff(two.losses[0], one.losses[0]) < 1e-5);
    std::string name;
    const double g = worst_rel(one.specs, two.grad, one.grad, name);
    INFO("gradient, worst tensor " << name << ": " << g);
    CHECK(g < 1e-5);
  }
}

TEST_CASE("train --device cuda: dp 2 equals one process on the same sequences (emulated)", "[emu]") {
  for (const char* arch : kArchs) {
    INFO("--model " << arch);
    const std::string a = std::string("--model ") + arch + " --device cuda --precision fp32";
    Run one = train(a + " --batch 2", 1, 3), dp = train(a + " --batch 1", 2, 3);
    for (size_t s = 0; s < one.losses.size(); s++) {
      INFO("step " << s + 1 << ": dp 2 " << dp.losses[s] << " one " << one.losses[s]);
      CHECK(rel_diff(dp.losses[s], one.losses[s]) < 1e-5);
    }
    std::string name;
    const double p = worst_rel(one.specs, dp.params, one.params, name);
    INFO("parameters after 3 steps, worst tensor " << name << ": " << p);
    CHECK(p < 1e-5);
  }
}

TEST_CASE("train --device cuda --zero 1 (emulated): fp32 as without, bf16 replicas identical", "[emu]") {
  const std::string a = "--model gpt2 --device cuda --batch 1";
  Run plain = train(a + " --precision fp32", 2, 2), zero = train(a + " --precision fp32 --zero 1", 2, 2);
  CHECK(zero.losses == plain.losses);
  CHECK(zero.params == plain.params);
  // bf16: every rank ends with the same bf16 weights and masters.
  std::vector<std::vector<float>> masters(2);
  std::vector<std::vector<uint16_t>> weights(2);
  std::vector<double> loss(2);
  Options o = options(a + " --precision bf16 --zero 1 --ranks 2");
  LocalOptions lo;
  lo.device = run_device(o);
  run_local(2, [&](Comm& world) {
    Trainer tr(o, world);
    tr.step();
    loss[world.rank()] = tr.step().loss;
    masters[world.rank()] = tr.model().params.to_host();
    weights[world.rank()] = bf16_buffer(tr.model().params);
  }, lo);
  Run bf = train(a + " --precision bf16", 2, 2);
  CHECK(rel_diff(loss[0], bf.losses[1]) < 2e-2);
  CHECK(masters[0] == masters[1]);
  CHECK(weights[0] == weights[1]);
  CHECK(masters[0] != bf.params0);
}

TEST_CASE("train --device cuda --check-state passes on llm.c's tiny GPT-2 (emulated)", "[emu]") {
  for (int sp : {1, 2}) {
    INFO("--sp " << sp);
    const std::string args = "train --checkpoint " + std::string(ULYSSES_SOURCE_DIR) + "/tests/data/gpt2_tiny_model.bin" +
                             " --check-state " + std::string(ULYSSES_SOURCE_DIR) + "/tests/data/gpt2_tiny_state.bin" +
                             " --device cuda --precision fp32 --threads 1 --sp " + std::to_string(sp) + " --ranks " +
                             std::to_string(sp);
    std::istringstream in(args);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(&w[0]);
    Options o = parse_options(int(argv.size()), argv.data());
    LocalOptions lo;
    lo.device = run_device(o);
    int code = -1;
    run_local(sp, [&](Comm& world) {
      const int c = check_state_rank(o, world);
      if (world.rank() == 0) code = c;
    }, lo);
    CHECK(code == 0);
  }
}

}  // namespace train_cases
