// `train --device cuda` with several ranks as threads of one process (the local communicator, its
// collectives staged through host memory), emulated (tests/emu/test_train_cuda.cpp) and on a GPU
// (tests/gpu/test_train_gpu.cpp); include after train_cuda_cases.h:
//   - Ulysses sp 2 vs sp 1 on one sequence batch: the loss and the world-summed gradient, fp32,
//     within 1e-5 (of each tensor's largest element);
//   - dp 2 vs one process on the same sequences, fp32: every step's loss and world-summed gradient
//     within 1e-5, the weights after 3 steps within 1e-4 (Adam and eps: see train_cuda_cases.h);
//   - ZeRO-1 over dp 2: bitwise equal to plain dp 2 in fp32 and bf16 (losses, gradient norms,
//     masters, bf16 weights, over clipped steps), each rank keeping the bf16 masters of its shard
//     only (the owner rounds its shard, the others take its bits);
//   - an update that overflows the weights fails step 1 on both ranks, bf16 with and without
//     sharded masters, and one whose masters are finite f32 past bf16's range;
//   - --check-state passes in fp32, sp 1 and sp 2, on a GPT-2 debug state with a head dim the CUDA
//     attention runs (llm.c's tiny reference has head dim 8; see write_reference).
#pragma once
#include <fstream>

#include "engine/check_state.h"
#include "engine/export.h"
#include "engine/llmc_format.h"
#include "layers/linear.h"
#include "parallel/zero.h"

namespace train_cases {

TEST_CASE("train --device cuda: sp 2 equals sp 1 (local communicator, device buffers)", UL_CUDA_TEST_TAG) {
  // batch 1 too: there the all-to-alls read and write the tensors directly (parallel/ulysses.cpp)
  for (const char* batch : {"--batch 2", "--batch 1"})
  for (const char* arch : kArchs) {
    INFO("--model " << arch << " " << batch);
    const std::string a = std::string("--model ") + arch + " --device cuda --precision fp32 " + batch;
    Run one = train(a + " --sp 1", 1, 1), two = train(a + " --sp 2", 2, 1);
    CHECK(rel_diff(two.losses[0], one.losses[0]) < 1e-5);
    std::string name;
    const double g = worst_rel(one.specs, two.grad, one.grad, name);
    INFO("gradient, worst tensor " << name << ": " << g);
    CHECK(g < 1e-5);
  }
}

TEST_CASE("train --device cuda: dp 2 equals one process on the same sequences", UL_CUDA_TEST_TAG) {
  for (const char* arch : kArchs) {
    INFO("--model " << arch);
    const std::string a = std::string("--model ") + arch + " --device cuda --precision fp32";
    Run one = train(a + " --batch 2", 1, 3), dp = train(a + " --batch 1", 2, 3);
    std::string name;
    for (size_t s = 0; s < one.losses.size(); s++) {
      const double g = worst_rel(one.specs, dp.grads[s], one.grads[s], name);
      INFO("step " << s + 1 << ": dp 2 " << dp.losses[s] << " one " << one.losses[s] << "; gradient, worst tensor "
                   << name << ": " << g);
      CHECK(rel_diff(dp.losses[s], one.losses[s]) < 1e-5);
      CHECK(g < 1e-5);
    }
    const double p = worst_rel(one.specs, dp.params, one.params, name, true);
    INFO("parameters after 3 steps, worst tensor " << name << ": " << p);
    CHECK(p < 1e-4);
  }
}

TEST_CASE("train --device cuda --zero 1: bitwise as without, fp32 and bf16 (masters sharded)", UL_CUDA_TEST_TAG) {
  // 3 steps with the gradient clipped (the default --grad-clip 1 is below these norms): the norm
  // sets the clip factor, so a norm summed another way under --zero 1 moves every weight.
  for (const char* arch : kArchs)
  for (const char* precision : {" --precision fp32", " --precision bf16"}) {
    INFO(arch << precision);
    const std::string a = std::string("--model ") + arch + " --device cuda --batch 1 --lr 1e-2" + precision;
    const Run plain = train(a, 2, 3), zero = train(a + " --zero 1", 2, 3);
    CHECK(zero.losses == plain.losses);
    CHECK(zero.norms == plain.norms);
    for (double n : plain.norms) CHECK(n > 1.0);
    CHECK(zero.params == plain.params);  // bf16: the masters, gathered from their owners
    CHECK(zero.bf16 == plain.bf16);
    CHECK(zero.params != zero.params0);  // the steps did move them
  }
  const std::string a = "--model gpt2 --device cuda --batch 1";
  // bf16: each rank keeps the masters of its own shard only, and all end with the same bf16 weights.
  Options o = options(a + " --precision bf16 --zero 1 --ranks 2");
  LocalOptions lo;
  lo.device = run_device(o);
  // Rank threads only record (Catch2 is not thread-safe); the checks run here.
  std::vector<std::vector<uint16_t>> weights(2);
  std::vector<int> sharded(2, 0), range_ok(2, 0);
  std::vector<std::string> to_host_error(2);
  run_local(2, [&](Comm& world) {
    Trainer tr(o, world);
    tr.step();
    const Params& P = tr.model().params;
    const int r = world.rank();
    const ZeroShard z = zero_shard(P.numel(), 2, r);
    sharded[r] = P.masters_sharded();
    range_ok[r] = P.master_lo() == z.lo && P.master_hi() == z.hi;
    try {
      P.to_host();
    } catch (const std::exception& e) {
      to_host_error[r] = e.what();
    }
    weights[r] = bf16_buffer(P);
  }, lo);
  for (int r = 0; r < 2; r++) {
    INFO("rank " << r);
    CHECK(sharded[r] == 1);
    CHECK(range_ok[r] == 1);
    CHECK(to_host_error[r].find("master weights of elements") != std::string::npos);
  }
  CHECK(weights[0] == weights[1]);
}

TEST_CASE("train --device cuda: an update that overflows the weights fails the step on every rank, masters "
          "sharded or not", UL_CUDA_TEST_TAG) {
  // The second: masters finite in f32 (up to 3.395e38 with beta1 0, whose step is lr x g / |g|) but
  // past bf16's largest value (3.3895e38), so the weights the forward reads round to infinity.
  for (const char* zero : {" --lr 3e38", " --lr 3e38 --zero 1", " --lr 3.395e38 --beta1 0 --weight-decay 0 --warmup 1"}) {
    INFO("bf16" << zero);
    Options o = options(std::string("--model gpt2 --device cuda --batch 1 --precision bf16 --ranks 2") + zero);
    LocalOptions lo;
    lo.device = run_device(o);
    std::vector<std::string> error(2);
    std::vector<int> sharded(2, 0);
    run_local(2, [&](Comm& world) {
      Trainer tr(o, world);
      sharded[world.rank()] = tr.model().params.masters_sharded();
      try {
        tr.step();
      } catch (const std::exception& e) {
        error[world.rank()] = e.what();
      }
    }, lo);
    for (int r = 0; r < 2; r++) {
      INFO("rank " << r << ": " << error[r]);
      CHECK(sharded[r] == (std::string(zero).find("--zero 1") != std::string::npos ? 1 : 0));
      CHECK(error[r].find("step 1: the update made weights that are not finite") != std::string::npos);
    }
  }
}

// An llm.c debug state (format of engine/llmc_format.h) for a GPT-2 the CUDA attention can run:
// llm.c's own tiny reference (tests/data) has head dim 8, and the CUDA kernels are built for head
// dims 32, 64 and 128. Its logits, loss and gradients come from the CPU backend, which the CPU
// tests hold to llm.c's reference; here the device must reproduce them through --check-state.
inline void write_reference(const std::string& model_path, const std::string& state_path) {
  const LlmcConfig lc{16, 50, 128, 1, 2, 64};  // max_seq, vocab, padded vocab, layers, heads, channels
  const ModelConfig cfg = gpt2_config(lc);
  const int B = 2, T = 16, V = lc.vocab, C = lc.channels;
  Context c(Device::cpu);
  ContextGuard guard(c);
  Transformer model(cfg);
  model.init_weights(7);
  const std::vector<float> w = model.params.to_host();
  write_llmc_checkpoint(model_path, lc, w.data());
  std::vector<int32_t> idx(B * T), tgt(B * T), pos(B * T);
  for (int k = 0; k < B * T; k++) idx[k] = (k * 7 + 3) % V, tgt[k] = (k * 11 + 5) % V, pos[k] = k % T;
  auto dev = [&](const std::vector<int32_t>& v) {
    Tensor t = c.empty({B, T}, DType::i32);
    copy_from_host(t, v.data());
    return t;
  };
  ModelInputs in{dev(idx), dev(tgt), dev(pos), dev(pos), Tensor{}};
  model.params.zero_grad();
  CrossEntropyStats st;
  {
    Recording rec(true);
    st = model.forward(in, 1.0f / float(B * T));
    c.tape.backward();
  }
  std::vector<float> logits(size_t(B) * T * V);
  cpu::linear_forward<float>(logits.data(), model.last_hidden.f32(), w.data() + model.params.spec("wte").offset, nullptr,
                             B * T, C, V);
  const float loss = float(st.loss_sum / (B * T));
  int32_t h[256] = {20240327, 2, B, T};
  std::ofstream f(state_path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(h), sizeof h);
  f.write(reinterpret_cast<const char*>(idx.data()), idx.size() * 4);
  f.write(reinterpret_cast<const char*>(tgt.data()), tgt.size() * 4);
  f.write(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
  f.write(reinterpret_cast<const char*>(&loss), 4);
  f.write(reinterpret_cast<const char*>(model.params.grad()), model.params.numel() * 4);
  REQUIRE(f.good());
}

TEST_CASE("train --device cuda --check-state passes in fp32, sp 1 and sp 2", UL_CUDA_TEST_TAG) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ulysses_check_state_cuda_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string model = (dir / "model.bin").string(), state = (dir / "state.bin").string();
  write_reference(model, state);
  // The CPU at sp 1 wrote the reference: its row checks only that the state round-trips (and the
  // CPU's determinism); the other three are the comparisons.
  for (const char* device : {"cpu", "cuda"})
    for (int sp : {1, 2}) {
      INFO("--device " << device << " --sp " << sp);
      const std::string args = "train --checkpoint " + model + " --check-state " + state + " --device " + device +
                               " --precision fp32 --threads 1 --sp " + std::to_string(sp) + " --ranks " + std::to_string(sp);
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
  fs::remove_all(dir);
}

}  // namespace train_cases
